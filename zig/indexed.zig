//! The indexed layout: records of any length and codec, each located by a
//! 32-byte entry (offset, lengths, codec, checksum) in the index file.
//!
//! Invariant: entry i of the committed index describes a payload inside the
//! committed data file whose checksum it holds; payloads are never moved or
//! rewritten in place, only superseded (replace) or dropped (compact).
const std = @import("std");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const commit = @import("commit.zig");
const plans = @import("plans.zig");
const Store = @import("store.zig").Store;
const Snapshot = @import("snapshot.zig").Snapshot;

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const Layout = format.Layout;
const Codec = format.Codec;
const block_bytes = format.block_bytes;
const encode = @import("encode.zig");

pub fn append(store: *Store, source: []const u8, offsets: []const u64, record_codec: Codec) Error!void {
    const current = store.head();
    var next = current.superblock;
    const creating = next.getLayout() == .empty;
    if (creating) {
        next.layout = @intFromEnum(Layout.indexed);
        next.data_file = next.generation + 1;
        next.index_file = next.generation + 1;
    }
    const data = if (creating) try commit.createFile(store, .data, next.data_file) else try commit.openFile(store, .data, next.data_file);
    defer io.closeFile(data);
    const index = if (creating) try commit.createFile(store, .index, next.index_file) else try commit.openFile(store, .index, next.index_file);
    defer io.closeFile(index);
    // Payloads go out piece by piece while the rest compress: past the
    // committed length, so a failure leaves nothing a commit points at.
    const batch = try encode.writeBatch(store.threads, current.dictionary, source, offsets, record_codec, data, next.data_bytes);
    defer allocator.free(batch.entries);
    try io.write(index, std.mem.sliceAsBytes(batch.entries), next.record_count * @sizeOf(Entry));
    try commit.syncFile(store, data);
    try commit.syncFile(store, index);
    if (creating) try commit.syncDir(store);
    next.record_count += offsets.len;
    next.data_bytes += batch.payload_bytes;
    next.live_bytes += batch.payload_bytes;
    try commit.commit(store, next);
    // The directory sync above and the commit's superblock sync made a
    // staged store's creation durable too.
    if (creating and store.durable) store.created_unsynced = false;
}

pub fn replace(store: *Store, indices: []const u64, source: []const u8, offsets: []const u64, record_codec: Codec) Error!void {
    const current = store.head();
    var batch = try encode.encodeBatch(store.threads, current.dictionary, source, offsets, record_codec, current.superblock.data_bytes);
    defer batch.deinit();
    const data = try commit.openFile(store, .data, current.superblock.data_file);
    defer io.closeFile(data);
    try io.write(data, batch.payload, current.superblock.data_bytes);
    try commit.syncFile(store, data);

    const patches = allocator.alloc(plans.Patch, indices.len) catch return error.OutOfMemory;
    defer allocator.free(patches);
    var freed: u64 = 0;
    const old_entries = current.entries();
    for (indices, batch.entries, patches) |index, *entry, *patch| {
        patch.* = .{ .row = index, .bytes = std.mem.asBytes(entry) };
        freed += old_entries[index].storedBytes();
    }
    std.mem.sort(plans.Patch, patches, {}, plans.Patch.lessThan);
    const plan = plans.PatchPlan{ .old = std.mem.sliceAsBytes(old_entries), .stride = @sizeOf(Entry), .patches = patches };
    // live_bytes counts the new payload; the data file grew by it too.
    var live = current.superblock.live_bytes - @min(freed, current.superblock.live_bytes) + batch.payload.len;
    live = @min(live, current.superblock.data_bytes + batch.payload.len);
    try rewriteWithData(store, current.count(), &plan, live, current.superblock.data_bytes + batch.payload.len);
}

pub fn rewrite(store: *Store, new_count: u64, plan: anytype, live_bytes: u64) Error!void {
    try rewriteWithData(store, new_count, plan, live_bytes, store.head().superblock.data_bytes);
}

fn rewriteWithData(store: *Store, new_count: u64, plan: anytype, live_bytes: u64, data_bytes: u64) Error!void {
    const current = store.head();
    var next = current.superblock;
    const id = next.generation + 1;
    const index = try commit.createFile(store, .index, id);
    defer io.closeFile(index);
    _ = try plans.streamRows(index, null, new_count, @sizeOf(Entry), plan);
    try commit.syncFile(store, index);
    try commit.syncDir(store);
    next.index_file = id;
    next.record_count = new_count;
    next.data_bytes = data_bytes;
    next.live_bytes = live_bytes;
    try commit.commit(store, next);
    commit.unlinkReplaced(store, current.superblock);
}

pub fn compact(store: *Store, current: *const Snapshot) Error!void {
    var next = current.superblock;
    const id = next.generation + 1;
    const data = try commit.createFile(store, .data, id);
    defer io.closeFile(data);
    const index = try commit.createFile(store, .index, id);
    defer io.closeFile(index);
    // The payloads stream into the new data file as the entries are made.
    var payloads = try plans.RowWriter.init(data, null);
    defer payloads.deinit();
    var entries = try plans.RowWriter.init(index, null);
    defer entries.deinit();
    const old_data = current.dataBytes();
    for (current.entries(), 0..) |old, k| {
        if (old.invalidReason(current.superblock.data_bytes)) |reason| {
            return status.fail(error.Corrupt, "cannot compact: record {d}: {s}", .{ k, reason });
        }
        var entry = old;
        entry.offset = payloads.position;
        try payloads.write(old_data[old.offset..][0..old.storedBytes()]);
        try entries.write(std.mem.asBytes(&entry));
    }
    const written = try payloads.finish();
    _ = try entries.finish();
    try commit.syncFile(store, data);
    try commit.syncFile(store, index);
    try commit.syncDir(store);
    next.data_file = id;
    next.index_file = id;
    next.data_bytes = written.bytes;
    next.live_bytes = written.bytes;
    try commit.commit(store, next);
    commit.unlinkReplaced(store, current.superblock);
}
