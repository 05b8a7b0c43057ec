//! The commit protocol and recovery: how a writer turns bytes on disk into
//! the store's next state, and how the next writer cleans up after one that
//! stopped half way.
//!
//! Invariant: data is durable before the metadata that points to it. An
//! operation writes payloads past committed lengths or into new files, syncs
//! them (and the directory, for new names), and only then writes and syncs
//! the superblock of the next generation (superblock.zig). Files a commit
//! replaced are unlinked only after that sync, so a crash at any point leaves
//! either the old state or the new one, both whole.
//!
//! A sync that fails may have lost bytes the kernel had accepted, and a later
//! sync would not say so; after one, this writer refuses to write until the
//! store is reopened, and the reopening writer's recovery starts from what is
//! on disk.
const std = @import("std");
const builtin = @import("builtin");
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const superblock_file = @import("superblock.zig");
const snapshot_module = @import("snapshot.zig");
const journal = @import("journal.zig");
const seqlock = @import("seqlock.zig");
const undo_module = @import("undo.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Superblock = format.Superblock;
const Entry = format.Entry;
const Snapshot = snapshot_module.Snapshot;
const block_bytes = format.block_bytes;

pub const Writer = struct {
    lock: io.File,
    /// The shared page of the lock file, mapped: every commit names its
    /// generation in it, and in-place replaces hold its sequence lock.
    page: io.WritableMemory,
    superblock: io.File,
    /// What each superblock slot holds, to undo a slot write that failed.
    slots: [2]Superblock,
    /// The slot of the last synced generation: never written until the
    /// next synced commit is durable in the other one.
    synced_slot: u1,
    /// Set by a failed sync: no further commit from this handle.
    poisoned: bool = false,
    /// Set when a replaced file could not be deleted: the next write
    /// recovers again, so orphans do not outlive the writer.
    stale: bool = false,
    /// The journal of in-place replaces, once the superblock names one.
    journal: ?journal.Handle = null,
    /// Read-write handles of the data and sums files replaces write into,
    /// and the files they are.
    target: journal.OpenTarget = .{},
    /// An append synced the data and sums files after the last in-place
    /// replace: the checkpoint in its commit need not sync them again.
    journal_synced: bool = false,
    /// The undo area of a durable=False writer's in-place replaces.
    undo: undo_module.Undo = .{},

    pub fn close(writer: *Writer) void {
        assert(writer.page.len >= seqlock.shared_page_bytes);
        if (writer.journal) |*handle| handle.close();
        writer.undo.close();
        writer.target.close();
        io.unmapWritable(writer.page);
        io.closeFile(writer.superblock);
        io.closeFile(writer.lock); // Closing the descriptor releases the flock.
    }

    /// Records replayed or written since the superblock's checkpoint.
    /// Or blocks patched in place since the last durable commit under the
    /// undo area (undo.zig): the next commit must sync them too.
    pub fn journalPending(writer: *const Writer, superblock: *const Superblock) bool {
        if (writer.undo.active) return true;
        const handle = writer.journal orelse return false;
        return handle.last_sequence > superblock.journal_sequence;
    }
};

/// What the commit protocol and the layouts need of the store, passed down
/// by store.zig (which alone changes the store's state): the directory, the
/// writer, and the head the operation starts from.
pub const Context = struct {
    dir: io.Dir,
    path: []const u8,
    durable: bool,
    threads: u32,
    writer: *Writer,
    head: *Snapshot,
};

/// What a layout's write leaves for store.zig to commit and publish: the
/// next superblock, whose files are written and synced (as `durable` asks).
pub const Next = struct {
    superblock: Superblock,
    /// The superblock whose files `superblock` replaces: deleted once the
    /// commit is durable (`unlinkReplaced`).
    replaced: ?Superblock = null,
    /// The write created the store's first files under a directory sync: a
    /// durable commit makes a staged creation durable too.
    created: bool = false,
    /// The data and sums files were synced after the last in-place replace:
    /// the commit's journal checkpoint need not sync them again.
    data_synced: bool = false,
};

/// Opens the lock file and takes the writer lock, then the superblock file
/// and the shared page. The slots are read once the head is current
/// (`start`).
pub fn open(dir: io.Dir, path: []const u8) Error!Writer {
    const lock = io.createFile(dir, seqlock.lock_file_name, false) catch |err| {
        return status.wrap(err, "cannot write store '{s}' (its lock file cannot be created; " ++
            "a store in a read-only place can be read, not written)", .{path});
    };
    errdefer io.closeFile(lock);
    if (!try tryLockBriefly(lock)) {
        return status.fail(error.Locked, "store '{s}' is open for writing by another process " ++
            "or handle; zrecord allows one writer per store: close the other writer first", .{
            path,
        });
    }
    const file = try io.openFile(dir, superblock_file.file_name, .read_write);
    errdefer io.closeFile(file);
    // Before any commit of this writer, so every reader that maps data of
    // a later generation maps the sequence lock too.
    const page = try seqlock.mapPage(lock);
    assert(page.len >= seqlock.shared_page_bytes);
    return .{
        .lock = lock,
        .page = page,
        .superblock = file,
        .slots = undefined,
        .synced_slot = 0,
    };
}

/// Reads the slots and finds the synced one, once `head` is current.
pub fn start(writer: *Writer, head: Superblock) Error!void {
    assert(writer.journal == null);
    writer.slots = try readSlots(writer.superblock);
    writer.synced_slot = syncedSlot(writer.slots, head);
}

/// The refusal of a writer whose sync failed.
pub fn refusePoisoned(writer: *const Writer, path: []const u8) Error!void {
    if (!writer.poisoned) return;
    return status.fail(error.Io, "store '{s}' refuses writes after a failed sync (the disk may " ++
        "have dropped bytes it had accepted): close it and open it again, which recovers the " ++
        "last durable commit", .{path});
}

/// A reader that opens a fixed store holds the lock for a moment (to see
/// whether a killed writer left journal records to apply): a writer that
/// starts then waits it out, up to `lock_wait_ms`, rather than fail.
const lock_wait_ms = 200;

fn tryLockBriefly(lock: io.File) Error!bool {
    for (0..lock_wait_ms) |_| {
        if (try io.tryLock(lock)) return true;
        if (builtin.is_test) return false; // The simulated disk has one thread.
        std.Thread.sleep(std.time.ns_per_ms);
    }
    return io.tryLock(lock);
}

/// The slot that holds the last synced generation: the head's own, or the
/// base an unsynced head names.
fn syncedSlot(slots: [2]Superblock, head: Superblock) u1 {
    const synced = if (head.unsynced == 0) head.generation else head.synced_base;
    for (slots, 0..) |slot, index| {
        if (slot.invalidReason() == null and slot.generation == synced) return @intCast(index);
    }
    // Not in either slot only for a store whose superblock file is newer
    // than what open read; the slot the head is not in is the safe one to
    // keep.
    for (slots, 0..) |slot, index| {
        if (slot.invalidReason() == null and slot.generation == head.generation)
            return @intCast(index);
    }
    return 0;
}

fn readSlots(file: io.File) Error![2]Superblock {
    var slots: [2]Superblock = undefined;
    for (&slots, 0..) |*slot, index| {
        const read = try io.read(file, std.mem.asBytes(slot), index * format.slot_bytes);
        assert(read == @sizeOf(Superblock)); // superblock.read checked the length.
    }
    return slots;
}

/// Truncates the current files to their committed lengths and deletes
/// files no committed superblock names and temporary superblocks (left by
/// an interrupted writer or creator).
/// Before deleting, the latest superblock is made durable: once older
/// files are gone, a power loss must not fall back to a superblock that
/// names them.
pub fn recover(context: Context) Error!void {
    return recoverWith(context, false);
}

/// `head_synced`: the head's slot was synced just now, by a durable commit.
fn recoverWith(context: Context, head_synced: bool) Error!void {
    const superblock = context.head.superblock;
    assert(!context.writer.poisoned);
    // Only a durable commit syncs the head's slot.
    assert(!head_synced or superblock.unsynced == 0);
    const keep = [_]struct { kind: format.FileKind, id: u64, bytes: u64 }{
        .{ .kind = .data, .id = superblock.data_file, .bytes = superblock.data_bytes },
        .{
            .kind = .index,
            .id = superblock.index_file,
            .bytes = superblock.record_count * @sizeOf(Entry),
        },
        .{
            .kind = .sums,
            .id = superblock.sums_file,
            .bytes = (superblock.data_bytes / block_bytes) * 8,
        },
        .{ .kind = .dict, .id = superblock.dict_file, .bytes = superblock.dict_bytes },
        // Journal records past the checkpoint are replayed, not cut.
        .{ .kind = .journal, .id = superblock.journal_file, .bytes = std.math.maxInt(u64) },
    };
    var orphans: std.ArrayList([]u8) = .empty;
    defer {
        for (orphans.items) |name| allocator.free(name);
        orphans.deinit(allocator);
    }
    var iterator = io.iterate(context.dir);
    while (try iterator.next()) |name| {
        const orphan = if (format.parseFileName(name)) |parsed| orphan: {
            const wanted = for (keep) |file| {
                if (file.kind == parsed.kind and file.id == parsed.id) break true;
            } else false;
            break :orphan !wanted and parsed.id != 0;
        } else std.mem.startsWith(u8, name, superblock_file.temp_prefix) and
            name.len <= io.File.name_bytes_max;
        if (!orphan) continue;
        const copy = allocator.dupe(u8, name) catch return error.OutOfMemory;
        orphans.append(allocator, copy) catch {
            allocator.free(copy);
            return error.OutOfMemory;
        };
    }
    // A fixed store's data and sums files are opened as the replaces'
    // target, which the writer keeps.
    const target: ?journal.Target = if (superblock.getLayout() == .fixed)
        try context.writer.target.get(context.dir, &superblock)
    else
        null;
    for (keep) |file| {
        if (file.id == 0 or file.kind == .journal) continue;
        const kept: ?io.File = if (target) |opened| switch (file.kind) {
            .data => opened.data,
            .sums => opened.sums,
            else => null,
        } else null;
        const handle = kept orelse try openFile(context, file.kind, file.id);
        defer if (kept == null) io.closeFile(handle);
        // Committed lengths of a file only grow, so cutting past the
        // latest one never cuts what an older superblock points at.
        if (try io.length(handle) > file.bytes) try io.setLength(handle, file.bytes);
    }
    if (orphans.items.len == 0) return;
    // While the head is not synced, the last synced state (the other slot)
    // may name files the head does not: they wait for the next sync.
    if (superblock.unsynced != 0) return;
    if (!head_synced) try syncFileNow(context, context.writer.superblock);
    for (orphans.items) |name| try io.unlink(context.dir, name);
}

/// After an operation failed past `begin`: cuts the files back to what the
/// head commits and deletes the files it created, at once, so that a full
/// disk gets the failed write's bytes back now, not at the next write (the
/// bytes of a failed 3 MB append stayed, and kept the disk full). A writer
/// that refuses until reopened leaves this to the reopening writer. The
/// operation's failure stays the one reported; a failure here leaves the
/// cleanup to the next write.
pub fn discardFailed(context: Context, err: Error) void {
    if (context.writer.poisoned) return;
    const saved = status.save(err);
    defer status.restore(&saved);
    recover(context) catch {
        context.writer.stale = true;
    };
}

/// A commit on its way: the sealed next superblock, and whether it is
/// synced (`prepare`, `write`, then store.zig publishes it, then `finish`).
pub const Pending = struct {
    superblock: Superblock,
    durable: bool,
};

/// Checkpoints the journal into `next_in` and seals it as the generation
/// after the head. `durable_wanted`: sync the superblock (and, for a store
/// opened with durable=False, every file it names) before returning. A
/// commit that checkpoints journal records is always durable: the journal
/// is cut after it. Either way the slot written is the one that does not
/// hold the last synced generation, so a torn or lost commit falls back to
/// that one.
pub fn prepare(context: Context, next_in: Superblock, durable_wanted: bool) Error!Pending {
    const writer = context.writer;
    assert(!writer.poisoned);
    const previous = context.head;
    // Broken on purpose in the simulator: a commit after unsynced in-place
    // replaces left unsynced.
    const durable = durable_wanted or
        (writer.journalPending(&previous.superblock) and !undoSabotaged(writer));
    var next = next_in;
    next.generation = previous.superblock.generation + 1;
    // A durable commit of a durable=False store syncs every file it names
    // below; an append synced the data and sums files itself.
    // The flag covers this commit only: a stale one would let a later
    // checkpoint skip syncing bytes that replaces wrote since.
    const synced_by_caller = writer.journal_synced;
    writer.journal_synced = false;
    const synced = (durable and !context.durable) or synced_by_caller;
    try checkpointJournal(context, &next, synced);
    next.unsynced = @intFromBool(!durable);
    next.synced_base = if (durable) 0 else writer.slots[writer.synced_slot].generation;
    next.seal();
    // The next superblock is the head's successor, sealed, and says
    // whether it is synced: what `superblock.readFile` and open check.
    assert(next.generation == previous.superblock.generation + 1);
    assert(next.invalidReason() == null);
    assert((next.unsynced == 0) == durable);
    assert(next.generation > writer.slots[writer.synced_slot].generation);
    return .{ .superblock = next, .durable = durable };
}

/// Builds the snapshot of `pending` (its files mapped), syncs what a
/// durable=False store left unsynced if the commit is durable, and writes
/// (and syncs) its slot. Returns the snapshot for store.zig to publish.
pub fn write(
    context: Context,
    pending: Pending,
    dictionary: ?*const codec.Dictionary,
) Error!*Snapshot {
    const writer = context.writer;
    const next = pending.superblock;
    assert(!writer.poisoned);
    assert(next.generation == context.head.superblock.generation + 1);
    const previous = context.head;
    const snapshot = try Snapshot.build(context.dir, next, previous, dictionary);
    errdefer snapshot.discard(previous);
    if (pending.durable and !context.durable) try syncNamed(context, snapshot);
    const slot = 1 - writer.synced_slot;
    superblock_file.write(
        writer.superblock,
        &next,
        &writer.slots[slot],
        slot,
        pending.durable,
    ) catch |err| {
        writer.poisoned = true;
        return err;
    };
    writer.slots[slot] = next;
    if (pending.durable) {
        writer.synced_slot = slot;
        seqlock.recordSynced(writer.page, next.generation);
    }
    // The last synced generation stays in a slot this commit did not write
    // unless this commit is it.
    assert(pending.durable == (writer.synced_slot == slot));
    assert(snapshot.superblock.generation == next.generation);
    return snapshot;
}

/// After store.zig published `pending` (now `context.head`): deletes what
/// unsynced commits replaced once a commit is durable, restarts the journal
/// and names the new generation in the shared page.
pub fn finish(context: Context, pending: Pending) void {
    const writer = context.writer;
    const next = pending.superblock;
    assert(context.head.superblock.generation == next.generation);
    assert(writer.slots[writer.synced_slot].generation == next.generation or !pending.durable);
    if (pending.durable and writer.stale) {
        // Files unsynced commits replaced can go now. A failure here
        // leaves them for the next write; the commit stands.
        if (recoverWith(context, true)) |_| writer.stale = false else |_| {}
    }
    // The new superblock covers every record: the journal starts over,
    // over the dead records (see `journal.Handle.restart`).
    if (writer.journal) |*handle| handle.restart();
    // So do the undo area's records: they name an older generation.
    if (pending.durable) writer.undo.retire();
    // The shared page names the new generation, so the next reader to open
    // finds nothing to settle (`journal.settledAlready`).
    seqlock.lockPage(writer.page);
    seqlock.unlockPage(writer.page, next.generation, next.tail_checksum);
    // An indexed store replaces by copy: a superblock that names no journal
    // closes the writer's (a fixed store turned indexed).
    if (next.journal_file == 0) {
        if (writer.journal) |*handle| handle.close();
        writer.journal = null;
    }
}

/// Syncs every file `snapshot` names and the directory: the writes of the
/// commits a durable=False store made without syncing.
fn syncNamed(context: Context, snapshot: *const Snapshot) Error!void {
    assert(snapshot.superblock.unsynced == 0 and !context.durable);
    // Not the shared page (the lock file): it is never synced.
    for ([_]?*snapshot_module.Mapping{ snapshot.data, snapshot.index, snapshot.sums }) |mapping| {
        if (mapping) |m| try syncFileNow(context, m.file);
    }
    if (snapshot.superblock.dict_file != 0) {
        const file = try openFile(context, .dict, snapshot.superblock.dict_file);
        defer io.closeFile(file);
        try syncFileNow(context, file);
    }
    try syncDirNow(context);
}

/// Broken on purpose in the simulator: a commit after unsynced in-place
/// replaces neither durable nor syncing the blocks they patched.
fn undoSabotaged(writer: *const Writer) bool {
    return builtin.is_test and undo_module.sabotage == .unsynced_commit_after_undo and
        writer.undo.active;
}

/// Every commit is a journal checkpoint: the bytes replaces wrote in place
/// into files the next superblock still names are synced before it, and it
/// records the last sequence they cover.
fn checkpointJournal(context: Context, next: *Superblock, synced: bool) Error!void {
    const writer = context.writer;
    const previous = context.head;
    assert(next.generation == previous.superblock.generation + 1);
    if (writer.journalPending(&previous.superblock) and !synced and !undoSabotaged(writer)) {
        if (previous.data) |data| if (next.data_file == previous.superblock.data_file)
            try syncFileNow(context, data.file);
        if (previous.sums) |sums| if (next.sums_file == previous.superblock.sums_file)
            try syncFileNow(context, sums.file);
    }
    const handle = writer.journal orelse return;
    next.journal_sequence = handle.last_sequence;
    assert(next.journal_sequence >= previous.superblock.journal_sequence);
}

/// Deletes files the current superblock no longer names. Only called after
/// a durable commit, so a crash never falls back to a deleted file.
/// A durable=False store keeps them until its next sync: the last synced
/// state may still name them.
pub fn unlinkReplaced(context: Context, old: Superblock) void {
    const now = context.head.superblock;
    assert(old.generation < now.generation);
    if (now.unsynced != 0) {
        context.writer.stale = true; // The next sync deletes them.
        return;
    }
    const pairs = [_]struct { kind: format.FileKind, old: u64, now: u64 }{
        .{ .kind = .data, .old = old.data_file, .now = now.data_file },
        .{ .kind = .index, .old = old.index_file, .now = now.index_file },
        .{ .kind = .sums, .old = old.sums_file, .now = now.sums_file },
        .{ .kind = .journal, .old = old.journal_file, .now = now.journal_file },
    };
    for (pairs) |pair| {
        if (pair.old == 0 or pair.old == pair.now) continue;
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        // A failure here leaves an orphan that the next write deletes.
        io.unlinkDeferred(context.dir, format.fileName(&name_buffer, pair.kind, pair.old)) catch {
            context.writer.stale = true;
        };
    }
}

/// Creates (or empties) store file `kind`-`id`.
pub fn createFile(context: Context, kind: format.FileKind, id: u64) Error!io.File {
    assert(id > 0); // A new file is named for the generation that commits it.
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    return io.createFile(context.dir, format.fileName(&name_buffer, kind, id), true);
}

pub fn openFile(context: Context, kind: format.FileKind, id: u64) Error!io.File {
    assert(id > 0); // File 0 is the superblock's "no such file".
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    return io.openFile(context.dir, format.fileName(&name_buffer, kind, id), .read_write);
}

/// Syncs a file the next commit will point at; a failure poisons the
/// writer. A durable=False store defers it to the next sync.
pub fn syncFile(context: Context, file: io.File) Error!void {
    if (!context.durable) return;
    return syncFileNow(context, file);
}

pub fn syncFileNow(context: Context, file: io.File) Error!void {
    io.sync(file) catch |err| {
        context.writer.poisoned = true;
        return err;
    };
}

/// Syncs the store directory after new names; a failure poisons the
/// writer. A durable=False store defers it to the next sync.
pub fn syncDir(context: Context) Error!void {
    if (!context.durable) return;
    return syncDirNow(context);
}

pub fn syncDirNow(context: Context) Error!void {
    io.syncDir(context.dir) catch |err| {
        context.writer.poisoned = true;
        return err;
    };
}
