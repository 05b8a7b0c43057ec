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
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const superblock_file = @import("superblock.zig");
const snapshot_module = @import("snapshot.zig");
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
    superblock: io.File,
    /// What each superblock slot holds, to undo a slot write that failed.
    slots: [2]Superblock,
    /// Set by a failed sync: no further commit from this handle.
    poisoned: bool = false,
    /// Set when a replaced file could not be deleted: the next write
    /// recovers again, so orphans do not outlive the writer.
    stale: bool = false,
};

/// Takes the writer lock on first use, then discards what a crashed writer
/// left past the committed state.
pub fn begin(store: *Store) Error!void {
    if (store.writer) |*writer| {
        if (writer.poisoned) {
            return status.fail(error.Io, "store '{s}' refuses writes after a failed sync (the disk may have dropped bytes it had accepted): close it and open it again, which recovers the last durable commit", .{store.path});
        }
        if (writer.stale) {
            try recover(store);
            writer.stale = false;
        }
        return;
    }
    const lock = io.createFile(store.dir, "lock", false) catch |err| {
        return status.wrap(err, "cannot write store '{s}' (its lock file cannot be created; a store in a read-only place can be read, not written)", .{store.path});
    };
    errdefer io.closeFile(lock);
    if (!try io.tryLock(lock)) {
        return status.fail(error.Locked, "store '{s}' is open for writing by another process or handle; zrecord allows one writer per store: close the other writer first", .{store.path});
    }
    const file = try io.openFile(store.dir, superblock_file.file_name, .read_write);
    errdefer io.closeFile(file);
    try store.refreshLocked();
    // Read before the assignment: a failed `try` inside the literal would
    // leave `store.writer` half set.
    const slots = try readSlots(file);
    store.writer = .{ .lock = lock, .superblock = file, .slots = slots };
    errdefer store.writer = null;
    try recover(store);
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
    const superblock = store.head().superblock;
    const keep = [_]struct { kind: format.FileKind, id: u64, bytes: u64 }{
        .{ .kind = .data, .id = superblock.data_file, .bytes = superblock.data_bytes },
        .{ .kind = .index, .id = superblock.index_file, .bytes = superblock.record_count * @sizeOf(Entry) },
        .{ .kind = .sums, .id = superblock.sums_file, .bytes = (superblock.data_bytes / block_bytes) * 8 },
        .{ .kind = .dict, .id = superblock.dict_file, .bytes = superblock.dict_bytes },
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
    for (keep) |file| {
        if (file.id == 0) continue;
        const handle = try openFile(store, file.kind, file.id);
        defer io.closeFile(handle);
        // Committed lengths of a file only grow, so cutting past the
        // latest one never cuts what an older superblock points at.
        if (try io.length(handle) > file.bytes) try io.setLength(handle, file.bytes);
    }
    if (orphans.items.len == 0) return;
    try syncFile(store, store.writer.?.superblock);
    for (orphans.items) |name| try io.unlink(store.dir, name);
}

/// Makes `next_in` the store's next generation: seals it, maps its files,
/// writes and syncs its slot, and publishes it to readers.
pub fn commit(store: *Store, next_in: Superblock) Error!void {
    const writer = &store.writer.?;
    assert(!writer.poisoned);
    const previous = store.head();
    var next = next_in;
    next.generation = previous.superblock.generation + 1;
    next.seal();
    assert(next.invalidReason() == null);
    const snapshot = try Snapshot.build(store.dir, next, previous, try store.loadDictionary(next));
    errdefer snapshot.discard(previous);
    const slot = next.generation % 2;
    superblock_file.write(writer.superblock, &next, &writer.slots[slot]) catch |err| {
        writer.poisoned = true;
        return err;
    };
    writer.slots[slot] = next;
    store.fell_back = false;
    store.snapshots.publish(snapshot);
}

/// Deletes files the current superblock no longer names. Only called after
/// a durable commit, so a crash never falls back to a deleted file.
pub fn unlinkReplaced(store: *Store, old: Superblock) void {
    const now = store.head().superblock;
    const pairs = [_]struct { kind: format.FileKind, old: u64, now: u64 }{
        .{ .kind = .data, .old = old.data_file, .now = now.data_file },
        .{ .kind = .index, .old = old.index_file, .now = now.index_file },
        .{ .kind = .sums, .old = old.sums_file, .now = now.sums_file },
    };
    for (pairs) |pair| {
        if (pair.old == 0 or pair.old == pair.now) continue;
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        // A failure here leaves an orphan that the next write deletes.
        io.unlink(store.dir, format.fileName(&name_buffer, pair.kind, pair.old)) catch {
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

/// Syncs a file the next commit will point at; a failure poisons the writer.
pub fn syncFile(store: *Store, file: io.File) Error!void {
    io.sync(file) catch |err| {
        store.writer.?.poisoned = true;
        return err;
    };
}

/// Syncs the store directory after new names; a failure poisons the writer.
pub fn syncDir(store: *Store) Error!void {
    io.syncDir(store.dir) catch |err| {
        store.writer.?.poisoned = true;
        return err;
    };
}
