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
const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const Layout = format.Layout;
const Codec = format.Codec;
const block_bytes = format.block_bytes;
const encode = @import("encode.zig");
const Context = commit.Context;
const Next = commit.Next;
/// Writes the records packed in `source` (record k at `offsets[k]`) past
/// the committed data, and their entries. Returns the next superblock.
pub fn append(
    context: Context,
    source: []const u8,
    offsets: []const u64,
    record_codec: Codec,
) Error!Next {
    const current = context.head;
    assert(current.layout() != .fixed);
    assert(offsets.len > 0);
    var next = current.superblock;
    const creating = next.getLayout() == .empty;
    if (creating) {
        next.layout = @intFromEnum(Layout.indexed);
        next.data_file = next.generation + 1;
        next.index_file = next.generation + 1;
    }
    const data = try openOrCreate(context, creating, .data, next.data_file);
    defer io.closeFile(data);
    const index = try openOrCreate(context, creating, .index, next.index_file);
    defer io.closeFile(index);
    // Payloads go out piece by piece while the rest compress: past the
    // committed length, so a failure leaves nothing a commit points at.
    const batch = try encode.writeBatch(
        context.threads,
        current.dictionary,
        source,
        offsets,
        record_codec,
        data,
        next.data_bytes,
    );
    defer allocator.free(batch.entries);
    try io.write(index, std.mem.sliceAsBytes(batch.entries), next.record_count * @sizeOf(Entry));
    assert(batch.entries.len == offsets.len);
    try commit.syncFile(context, data);
    try commit.syncFile(context, index);
    if (creating) try commit.syncDir(context);
    next.record_count += offsets.len;
    next.data_bytes += batch.payload_bytes;
    next.live_bytes += batch.payload_bytes;
    assert(next.record_count == current.count() + offsets.len);
    assert(next.live_bytes <= next.data_bytes);
    // The directory sync above and the commit's superblock sync make a
    // staged store's creation durable too.
    return .{ .superblock = next, .created = creating };
}

fn openOrCreate(context: Context, creating: bool, kind: format.FileKind, id: u64) Error!io.File {
    assert(kind == .data or kind == .index);
    if (creating) return commit.createFile(context, kind, id);
    return commit.openFile(context, kind, id);
}

/// Writes the new payloads past the committed data and a new index whose
/// entries `indices` point at them. Returns the next superblock.
pub fn replace(
    context: Context,
    indices: []const u64,
    source: []const u8,
    offsets: []const u64,
    record_codec: Codec,
) Error!Next {
    const current = context.head;
    assert(current.layout() == .indexed);
    assert(indices.len == offsets.len);
    const data_bytes = current.superblock.data_bytes;
    var batch = try encode.encodeBatch(
        context.threads,
        current.dictionary,
        source,
        offsets,
        record_codec,
        data_bytes,
    );
    defer batch.deinit();
    const data = try commit.openFile(context, .data, current.superblock.data_file);
    defer io.closeFile(data);
    try io.write(data, batch.payload, data_bytes);
    try commit.syncFile(context, data);

    const patches = allocator.alloc(plans.Patch, indices.len) catch return error.OutOfMemory;
    defer allocator.free(patches);
    var freed: u64 = 0;
    const old_entries = current.entries();
    for (indices, batch.entries, patches) |index, *entry, *patch| {
        patch.* = .{ .row = index, .bytes = std.mem.asBytes(entry) };
        freed += old_entries[index].storedBytes();
    }
    std.mem.sort(plans.Patch, patches, {}, plans.Patch.lessThan);
    const plan = plans.PatchPlan{
        .old = std.mem.sliceAsBytes(old_entries),
        .stride = @sizeOf(Entry),
        .patches = patches,
    };
    // live_bytes counts the new payload; the data file grew by it too.
    const live_before = current.superblock.live_bytes;
    var live = live_before - @min(freed, live_before) + batch.payload.len;
    live = @min(live, data_bytes + batch.payload.len);
    assert(patches.len == indices.len and live <= data_bytes + batch.payload.len);
    return rewriteWithData(context, current.count(), &plan, live, data_bytes + batch.payload.len);
}

/// A new index from `plan` over the same data file: the next superblock.
pub fn rewrite(context: Context, new_count: u64, plan: anytype, live_bytes: u64) Error!Next {
    assert(context.head.layout() == .indexed);
    return rewriteWithData(
        context,
        new_count,
        plan,
        live_bytes,
        context.head.superblock.data_bytes,
    );
}

fn rewriteWithData(
    context: Context,
    new_count: u64,
    plan: anytype,
    live_bytes: u64,
    data_bytes: u64,
) Error!Next {
    const current = context.head;
    assert(live_bytes <= data_bytes and data_bytes >= current.superblock.data_bytes);
    var next = current.superblock;
    const id = next.generation + 1;
    const index = try commit.createFile(context, .index, id);
    defer io.closeFile(index);
    _ = try plans.streamRows(index, null, new_count, @sizeOf(Entry), plan);
    try commit.syncFile(context, index);
    try commit.syncDir(context);
    next.index_file = id;
    next.record_count = new_count;
    next.data_bytes = data_bytes;
    next.live_bytes = live_bytes;
    assert(next.live_bytes <= next.data_bytes);
    return .{ .superblock = next, .replaced = current.superblock };
}

/// Copies the live payloads into a new data file and a new index that
/// points at them. Returns the next superblock.
pub fn compact(context: Context) Error!Next {
    const current = context.head;
    assert(current.layout() == .indexed);
    var next = current.superblock;
    const id = next.generation + 1;
    const data = try commit.createFile(context, .data, id);
    defer io.closeFile(data);
    const index = try commit.createFile(context, .index, id);
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
    const index_written = try entries.finish();
    assert(index_written.bytes == current.count() * @sizeOf(Entry));
    try commit.syncFile(context, data);
    try commit.syncFile(context, index);
    try commit.syncDir(context);
    next.data_file = id;
    next.index_file = id;
    next.data_bytes = written.bytes;
    next.live_bytes = written.bytes;
    return .{ .superblock = next, .replaced = current.superblock };
}
