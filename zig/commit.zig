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
const status = @import("status.zig");
const io = @import("io.zig");
const superblock_file = @import("superblock.zig");
const snapshot_module = @import("snapshot.zig");
const journal = @import("journal.zig");
const seqlock = @import("seqlock.zig");
const Store = @import("store.zig").Store;

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
    target: ?journal.Target = null,
    target_ids: [2]u64 = .{ 0, 0 },
    /// An append synced the data and sums files after the last in-place
    /// replace: the checkpoint in its commit need not sync them again.
    journal_synced: bool = false,

    pub fn close(writer: *Writer) void {
        if (writer.journal) |*handle| handle.close();
        if (writer.target) |target| journal.closeTarget(target);
        io.unmapWritable(writer.page);
        io.closeFile(writer.superblock);
        io.closeFile(writer.lock); // Closing the descriptor releases the flock.
    }

    /// Records replayed or written since the superblock's checkpoint.
    pub fn journalPending(writer: *const Writer, superblock: *const Superblock) bool {
        const handle = writer.journal orelse return false;
        return handle.last_sequence > superblock.journal_sequence;
    }
};

/// Takes the writer lock on first use, then discards what a crashed writer
/// left past the committed state.
pub fn begin(store: *Store) Error!void {
    try store.refuseDamaged(writes_refused);
    if (store.writer) |*writer| {
        if (writer.poisoned) {
            return status.fail(error.Io, "store '{s}' refuses writes after a failed sync (the disk may have dropped bytes it had accepted): close it and open it again, which recovers the last durable commit", .{store.path});
        }
        if (writer.stale) {
            try recover(store);
            // Recovery keeps what the last synced state names until a sync.
            writer.stale = store.head().superblock.unsynced != 0;
        }
        return;
    }
    const lock = io.createFile(store.dir, seqlock.lock_file_name, false) catch |err| {
        return status.wrap(err, "cannot write store '{s}' (its lock file cannot be created; a store in a read-only place can be read, not written)", .{store.path});
    };
    errdefer io.closeFile(lock);
    if (!try tryLockBriefly(lock)) {
        return status.fail(error.Locked, "store '{s}' is open for writing by another process or handle; zrecord allows one writer per store: close the other writer first", .{store.path});
    }
    const file = try io.openFile(store.dir, superblock_file.file_name, .read_write);
    errdefer io.closeFile(file);
    // Before any commit of this writer, so every reader that maps data of
    // a later generation maps the sequence lock too.
    const page = try seqlock.mapPage(lock);
    errdefer io.unmapWritable(page);
    // Set before the refresh, which then reads through `file`; the slots
    // and the synced one are filled in once the head is current.
    store.writer = .{ .lock = lock, .page = page, .superblock = file, .slots = undefined, .synced_slot = 0 };
    errdefer {
        if (store.writer.?.journal) |*handle| handle.close();
        if (store.writer.?.target) |target| journal.closeTarget(target);
        store.writer = null;
    }
    try store.refreshLocked();
    try store.refuseDamaged(writes_refused);
    const writer = &store.writer.?;
    writer.slots = try readSlots(file);
    writer.synced_slot = syncedSlot(writer.slots, store.head().superblock);
    try recover(store);
    // Files the last synced state names wait for the next sync.
    store.writer.?.stale = store.head().superblock.unsynced != 0;
    try recoverJournal(store);
}

const writes_refused = "Writes are refused: a writer's recovery would cut what the lost commits wrote";

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

/// Replays the journal records a crashed writer left after the checkpoint
/// and checkpoints them, so this writer starts from a superblock that
/// covers every committed replace.
fn recoverJournal(store: *Store) Error!void {
    const superblock = store.head().superblock;
    if (superblock.journal_file == 0) return;
    // Held by the writer at once: begin's errdefer closes it.
    store.writer.?.journal = try journal.open(store.dir, &superblock, store.writer.?.page);
    const replayed = try journal.settle(store.dir, &store.writer.?.journal.?, &superblock);
    if (replayed.records > 0) {
        store.head().superblock.tail_checksum = replayed.tail_checksum;
        var next = superblock;
        next.tail_checksum = replayed.tail_checksum;
        try commit(store, next);
    }
    // A new writer starts from a journal cut back to its page.
    store.writer.?.journal.?.restart();
    try store.writer.?.journal.?.trim();
}

/// The data and sums files of the current fixed generation, open for
/// in-place writes; reopened when a commit names other files.
pub fn replaceTarget(store: *Store) Error!journal.Target {
    const writer = &store.writer.?;
    const superblock = store.head().superblock;
    if (writer.target) |*target| {
        if (writer.target_ids[0] == superblock.data_file and writer.target_ids[1] == superblock.sums_file) {
            target.data_bytes = superblock.data_bytes;
            target.stride = superblock.record_bytes;
            return target.*;
        }
        journal.closeTarget(target.*);
        writer.target = null;
    }
    writer.target = try journal.openTarget(store.dir, &superblock);
    writer.target_ids = .{ superblock.data_file, superblock.sums_file };
    return writer.target.?;
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
        if (slot.invalidReason() == null and slot.generation == head.generation) return @intCast(index);
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
fn recover(store: *Store) Error!void {
    return recoverWith(store, false);
}

/// `head_synced`: the head's slot was synced just now, by a durable commit.
fn recoverWith(store: *Store, head_synced: bool) Error!void {
    const superblock = store.head().superblock;
    const keep = [_]struct { kind: format.FileKind, id: u64, bytes: u64 }{
        .{ .kind = .data, .id = superblock.data_file, .bytes = superblock.data_bytes },
        .{ .kind = .index, .id = superblock.index_file, .bytes = superblock.record_count * @sizeOf(Entry) },
        .{ .kind = .sums, .id = superblock.sums_file, .bytes = (superblock.data_bytes / block_bytes) * 8 },
        .{ .kind = .dict, .id = superblock.dict_file, .bytes = superblock.dict_bytes },
        // Journal records past the checkpoint are replayed, not cut.
        .{ .kind = .journal, .id = superblock.journal_file, .bytes = std.math.maxInt(u64) },
    };
    var orphans: std.ArrayList([]u8) = .empty;
    defer {
        for (orphans.items) |name| allocator.free(name);
        orphans.deinit(allocator);
    }
    var iterator = io.iterate(store.dir);
    while (try iterator.next()) |name| {
        const orphan = if (format.parseFileName(name)) |parsed| orphan: {
            const wanted = for (keep) |file| {
                if (file.kind == parsed.kind and file.id == parsed.id) break true;
            } else false;
            break :orphan !wanted and parsed.id != 0;
        } else std.mem.startsWith(u8, name, superblock_file.temp_prefix) and name.len <= io.File.name_bytes_max;
        if (!orphan) continue;
        const copy = allocator.dupe(u8, name) catch return error.OutOfMemory;
        orphans.append(allocator, copy) catch {
            allocator.free(copy);
            return error.OutOfMemory;
        };
    }
    // A fixed store's data and sums files are opened as the replaces'
    // target, which the writer keeps.
    const target: ?journal.Target = if (superblock.getLayout() == .fixed) try replaceTarget(store) else null;
    for (keep) |file| {
        if (file.id == 0 or file.kind == .journal) continue;
        const kept: ?io.File = if (target) |opened| switch (file.kind) {
            .data => opened.data,
            .sums => opened.sums,
            else => null,
        } else null;
        const handle = kept orelse try openFile(store, file.kind, file.id);
        defer if (kept == null) io.closeFile(handle);
        // Committed lengths of a file only grow, so cutting past the
        // latest one never cuts what an older superblock points at.
        if (try io.length(handle) > file.bytes) try io.setLength(handle, file.bytes);
    }
    if (orphans.items.len == 0) return;
    // While the head is not synced, the last synced state (the other slot)
    // may name files the head does not: they wait for the next sync.
    if (superblock.unsynced != 0) return;
    if (!head_synced) try syncFileNow(store, store.writer.?.superblock);
    for (orphans.items) |name| try io.unlink(store.dir, name);
}

/// After an operation failed past `begin`: cuts the files back to what the
/// head commits and deletes the files it created, at once, so that a full
/// disk gets the failed write's bytes back now, not at the next write (the
/// bytes of a failed 3 MB append stayed, and kept the disk full). A writer
/// that refuses until reopened leaves this to the reopening writer. The
/// operation's failure stays the one reported; a failure here leaves the
/// cleanup to the next write.
pub fn discardFailed(store: *Store, err: Error) void {
    const writer = if (store.writer) |*writer| writer else return;
    if (writer.poisoned) return;
    const saved = status.save(err);
    defer status.restore(&saved);
    recover(store) catch {
        writer.stale = true;
    };
}

/// Makes `next_in` the store's next generation: seals it, maps its files,
/// writes and syncs its slot, and publishes it to readers.
pub fn commit(store: *Store, next_in: Superblock) Error!void {
    return commitWith(store, next_in, store.durable);
}

/// `durable`: sync the superblock (and, for a store opened with
/// durable=False, every file it names) before returning. A commit that
/// checkpoints journal records is always durable: the journal is cut after
/// it. Either way the slot written is the one that does not hold the last
/// synced generation, so a torn or lost commit falls back to that one.
pub fn commitWith(store: *Store, next_in: Superblock, durable_wanted: bool) Error!void {
    const writer = &store.writer.?;
    assert(!writer.poisoned);
    const previous = store.head();
    const durable = durable_wanted or writer.journalPending(&previous.superblock);
    var next = next_in;
    next.generation = previous.superblock.generation + 1;
    // A durable commit of a durable=False store syncs every file it names
    // below; an append synced the data and sums files itself.
    // The flag covers this commit only: a stale one would let a later
    // checkpoint skip syncing bytes that replaces wrote since.
    const synced_by_caller = writer.journal_synced;
    writer.journal_synced = false;
    try checkpointJournal(store, previous, &next, (durable and !store.durable) or synced_by_caller);
    const slot = 1 - writer.synced_slot;
    next.unsynced = @intFromBool(!durable);
    next.synced_base = if (durable) 0 else writer.slots[writer.synced_slot].generation;
    next.seal();
    assert(next.invalidReason() == null);
    const snapshot = try Snapshot.build(store.dir, next, previous, try store.loadDictionary(next));
    errdefer snapshot.discard(previous);
    if (durable and !store.durable) try syncNamed(store, snapshot);
    superblock_file.write(writer.superblock, &next, &writer.slots[slot], slot, durable) catch |err| {
        writer.poisoned = true;
        return err;
    };
    writer.slots[slot] = next;
    if (durable) {
        writer.synced_slot = slot;
        seqlock.recordSynced(writer.page, next.generation);
    }
    store.fell_back = false;
    store.fall_back_reason_len = 0;
    store.snapshots.publish(snapshot);
    if (durable and writer.stale) {
        // Files unsynced commits replaced can go now. A failure here
        // leaves them for the next write; the commit stands.
        if (recoverWith(store, true)) |_| writer.stale = false else |_| {}
    }
    // The new superblock covers every record: the journal starts over,
    // over the dead records (see `journal.Handle.restart`).
    if (writer.journal) |*handle| handle.restart();
    // The shared page names the new generation, so the next reader to open
    // finds nothing to settle (`journal.settledAlready`).
    seqlock.lockPage(writer.page);
    seqlock.unlockPage(writer.page, next.generation, next.tail_checksum);
}

/// Syncs every file `snapshot` names and the directory: the writes of the
/// commits a durable=False store made without syncing.
fn syncNamed(store: *Store, snapshot: *const Snapshot) Error!void {
    // Not the shared page (the lock file): it is never synced.
    for ([_]?*snapshot_module.Mapping{ snapshot.data, snapshot.index, snapshot.sums }) |mapping| {
        if (mapping) |m| try syncFileNow(store, m.file);
    }
    if (snapshot.superblock.dict_file != 0) {
        const file = try openFile(store, .dict, snapshot.superblock.dict_file);
        defer io.closeFile(file);
        try syncFileNow(store, file);
    }
    try syncDirNow(store);
}

/// Makes every commit so far durable (durable=False stores), then deletes
/// the files that commits since the last sync replaced.
pub fn sync(store: *Store) Error!void {
    const writer = &store.writer.?;
    const head = store.head();
    if (head.superblock.unsynced != 0 or writer.journalPending(&head.superblock)) {
        try commitWith(store, head.superblock, true);
    } else if (!writer.stale) return;
    try recover(store);
    writer.stale = false;
}

/// A store opened with durable=False syncs before its first in-place
/// replace after unsynced commits: a journal record is always based on a
/// synced generation, so a power loss can never leave replaced bytes in
/// files whose superblock is gone.
pub fn syncBeforeReplace(store: *Store) Error!void {
    if (store.head().superblock.unsynced != 0) try sync(store);
}

/// Every commit is a journal checkpoint: the bytes replaces wrote in place
/// into files the next superblock still names are synced before it, and it
/// records the last sequence they cover.
fn checkpointJournal(store: *Store, previous: *const Snapshot, next: *Superblock, synced: bool) Error!void {
    const writer = &store.writer.?;
    const handle = writer.journal orelse return;
    if (writer.journalPending(&previous.superblock) and !synced) {
        if (previous.data) |data| if (next.data_file == previous.superblock.data_file) try syncFileNow(store, data.file);
        if (previous.sums) |sums| if (next.sums_file == previous.superblock.sums_file) try syncFileNow(store, sums.file);
    }
    next.journal_sequence = handle.last_sequence;
}

/// Deletes files the current superblock no longer names. Only called after
/// a durable commit, so a crash never falls back to a deleted file.
/// A durable=False store keeps them until its next sync: the last synced
/// state may still name them.
pub fn unlinkReplaced(store: *Store, old: Superblock) void {
    const now = store.head().superblock;
    if (now.unsynced != 0) {
        store.writer.?.stale = true; // The next sync deletes them.
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
        io.unlinkDeferred(store.dir, format.fileName(&name_buffer, pair.kind, pair.old)) catch {
            store.writer.?.stale = true;
        };
    }
}

/// Creates (or empties) store file `kind`-`id`.
pub fn createFile(store: *Store, kind: format.FileKind, id: u64) Error!io.File {
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    return io.createFile(store.dir, format.fileName(&name_buffer, kind, id), true);
}

pub fn openFile(store: *Store, kind: format.FileKind, id: u64) Error!io.File {
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    return io.openFile(store.dir, format.fileName(&name_buffer, kind, id), .read_write);
}

/// Syncs a file the next commit will point at; a failure poisons the
/// writer. A durable=False store defers it to the next sync.
pub fn syncFile(store: *Store, file: io.File) Error!void {
    if (!store.durable) return;
    return syncFileNow(store, file);
}

pub fn syncFileNow(store: *Store, file: io.File) Error!void {
    io.sync(file) catch |err| {
        store.writer.?.poisoned = true;
        return err;
    };
}

/// Syncs the store directory after new names; a failure poisons the
/// writer. A durable=False store defers it to the next sync.
pub fn syncDir(store: *Store) Error!void {
    if (!store.durable) return;
    return syncDirNow(store);
}

pub fn syncDirNow(store: *Store) Error!void {
    io.syncDir(store.dir) catch |err| {
        store.writer.?.poisoned = true;
        return err;
    };
}

test "an open that finds the journal at its page alone resets a stale shared page, as a replay would" {
    // The lock file is never synced: a power loss can leave its page odd
    // (written back mid-replace) or with an old tail checksum after a later
    // checkpoint cut the journal back to its page. The fast path of
    // journal.settle must still rewrite it, or every read would wait on it.
    const simulated = @import("testing/storage.zig");
    simulated.reset();
    const path = "settle-page";
    const rows = [_]u8{7} ** 40;
    const offsets = [_]u64{ 0, 10, 20, 30 };
    const writer = try Store.open(path, 1, false, true);
    _ = try writer.append(&rows, &offsets, .raw);
    const superblock = writer.head().superblock;
    writer.close();
    try std.testing.expect(superblock.journal_file != 0 and superblock.tail_checksum != 0);

    const dir = try io.openDir(path);
    defer io.closeDir(dir);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const journal_file = try io.openFile(dir, format.fileName(&name_buffer, .journal, superblock.journal_file), .read_only);
    try std.testing.expectEqual(format.journal_page_bytes, try io.length(journal_file));
    io.closeFile(journal_file);
    const lock = try io.openFile(dir, seqlock.lock_file_name, .read_write);
    var page: format.JournalPage = undefined;
    _ = try io.read(lock, std.mem.asBytes(&page), 0);
    page.sequence_lock = 5;
    page.tail_generation = superblock.generation;
    page.tail_checksum = superblock.tail_checksum ^ 1;
    try io.write(lock, std.mem.asBytes(&page), 0);
    io.closeFile(lock);

    const reader = try Store.open(path, 1, true, true);
    defer reader.close();
    const shared = reader.head().journalPage().?;
    try std.testing.expectEqual(@as(u64, 0), seqlock.readBegin(shared) % 2);
    try std.testing.expectEqual(superblock.tail_checksum, seqlock.tailChecksum(shared, &reader.head().superblock));
    var target: [40]u8 = undefined;
    try reader.gather(&.{ 0, 1, 2, 3 }, &target, null);
    try std.testing.expectEqualSlices(u8, &rows, &target);
}

test "a reader's open of a settled store only reads: no write, no writable map of the shared page" {
    const simulated = @import("testing/storage.zig");
    simulated.reset();
    const path = "settled-open";
    var rows = [_]u8{7} ** 40;
    const offsets = [_]u64{ 0, 10, 20, 30 };
    const writer = try Store.open(path, 1, false, true);
    _ = try writer.append(&rows, &offsets, .raw);
    @memset(rows[10..20], 9);
    try writer.replace(&.{1}, rows[10..20], offsets[0..1], .raw);
    writer.close();

    const writes = simulated.kindCount(.write);
    const maps = simulated.kindCount(.map);
    const reader = try Store.open(path, 1, true, true);
    defer reader.close();
    try std.testing.expectEqual(writes, simulated.kindCount(.write));
    // The shared page, the data and the sums, each mapped read-only once.
    try std.testing.expectEqual(maps + 3, simulated.kindCount(.map));
    var target: [40]u8 = undefined;
    try reader.gather(&.{ 0, 1, 2, 3 }, &target, null);
    try std.testing.expectEqualSlices(u8, &rows, &target);
}
