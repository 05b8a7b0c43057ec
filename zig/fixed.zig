//! The fixed layout: equal-length raw records at offset i * record_bytes,
//! no per-record table, a checksum per 16 KiB block of the data file.
//!
//! Invariant: the sums file holds the checksum of every full block of the
//! committed data, and the superblock that of the partial last block (the
//! journal's shared page, after in-place replaces), so every committed byte
//! is covered exactly once.
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
const block_bytes = format.block_bytes;
const assemble = @import("encode.zig").assemble;
const journal = @import("journal.zig");
const integrity = @import("integrity.zig");
const Snapshot = @import("snapshot.zig").Snapshot;
const Context = commit.Context;
const Next = commit.Next;

/// Writes `record_count` records of `record_bytes` each (`payload`) past
/// the committed data, and their block checksums. Returns the next
/// superblock, for store.zig to commit.
pub fn append(
    context: Context,
    payload: []const u8,
    record_count: u64,
    record_bytes: u64,
) Error!Next {
    const current = context.head;
    assert(current.layout() != .indexed);
    assert(payload.len == record_count * record_bytes);
    var next = current.superblock;
    const creating = next.getLayout() == .empty;
    if (creating) {
        next.layout = @intFromEnum(Layout.fixed);
        next.record_bytes = record_bytes;
        next.data_file = next.generation + 1;
        next.sums_file = next.generation + 1;
    }
    const data = try openOrCreate(context, creating, .data, next.data_file);
    defer io.closeFile(data);
    const sums_file = try openOrCreate(context, creating, .sums, next.sums_file);
    defer io.closeFile(sums_file);

    const old_bytes = current.dataBytes();
    const new_bytes = old_bytes.len + payload.len;
    // Blocks completed by this append get their checksums in the sums
    // file; the new partial tail block's checksum goes in the superblock.
    const first_block = old_bytes.len / block_bytes;
    // The old partial tail goes into a new checksum: it must hold first.
    if (!creating and old_bytes.len % block_bytes != 0) {
        const tail = old_bytes[first_block * block_bytes ..];
        if (format.blockChecksum(first_block, tail) != current.tailChecksum())
            return damagedBlock(current, first_block, "append");
    }
    const full_blocks = new_bytes / block_bytes;
    assert(full_blocks >= first_block);
    const sums = allocator.alloc(u64, full_blocks - first_block) catch return error.OutOfMemory;
    defer allocator.free(sums);
    var job = SumsJob{ .old = old_bytes, .payload = payload, .first = first_block, .sums = sums };
    // A durable append, or a store being created (a converter or a save
    // syncs it next), starts the disk on each piece as the next is copied,
    // so the fsync that follows waits for the last piece only. A
    // durable=False append leaves write-back to the kernel until sync().
    try writeSummed(data, &job, old_bytes.len, context.durable or creating);
    if (sums.len > 0) try io.write(sums_file, std.mem.sliceAsBytes(sums), first_block * 8);
    var scratch: [block_bytes]u8 = undefined;
    next.tail_checksum = 0;
    if (new_bytes % block_bytes != 0) {
        const bytes = assemble(old_bytes, payload, full_blocks * block_bytes, new_bytes, &scratch);
        next.tail_checksum = format.blockChecksum(full_blocks, bytes);
    }
    // A durable store gets its journal with its data file, under the same
    // directory sync, so its first replace costs one sync, not four.
    if (creating and context.durable and next.journal_file == 0) {
        next.journal_file = next.data_file;
        next.journal_sequence = 0;
        try journal.createFile(context.dir, next.journal_file, &next);
    }
    try commit.syncFile(context, data);
    try commit.syncFile(context, sums_file);
    if (creating) try commit.syncDir(context);
    next.record_count += record_count;
    next.data_bytes = new_bytes;
    next.live_bytes = new_bytes;
    assert(next.data_bytes == next.record_count * next.record_bytes);
    assert(next.live_bytes == next.data_bytes); // A fixed store holds no garbage.
    // The directory sync above and the commit's superblock sync make a
    // staged store's creation durable too.
    return .{ .superblock = next, .created = creating, .data_synced = context.durable };
}

/// Writes the job's payload after `offset` (the old bytes) in pieces that
/// end on multiples of `piece_bytes` in the file, each followed by the
/// checksums of the blocks it completes, so the hash reads rows the copy has
/// just brought into the cache. With `start_writeback` (and a payload of a
/// piece or more) each piece's write-back starts as soon as it is written,
/// so the fsync that follows waits for the last piece only.
fn writeSummed(data: io.File, job: *SumsJob, offset: u64, start_writeback: bool) Error!void {
    assert(offset == job.old.len and job.first == offset / block_bytes);
    const end = offset + job.payload.len;
    var at = offset;
    var summed: u64 = 0;
    while (at < end) {
        const piece_end = @min(end, (at / piece_bytes + 1) * piece_bytes);
        try io.write(data, job.payload[at - offset .. piece_end - offset], at);
        if (start_writeback and job.payload.len >= piece_bytes)
            io.startWriteback(data, at, piece_end - at);
        at = piece_end;
        const complete = @min(job.sums.len, at / block_bytes - job.first);
        job.run(summed, complete);
        summed = complete;
    }
    assert(summed == job.sums.len);
}

/// 2 MiB, measured on this machine's ext4 (medians; README "Saves and appends"):
/// - random access: a fresh mapping gathers 10,000 random rows of a file
///   written in 2 MiB pieces in 0.51-0.63 ms, in 256 KiB pieces in
///   0.92-1.11 ms, in one write in 0.68 ms (the page cache keeps a write's
///   large folios, and a fault maps a whole folio);
/// - write-back: a durable 10 MB append took 8.8 ms with write-back started
///   per 2 MiB, 8.6 per 1 MiB, 11.4 per 8 MiB;
/// - hashing each piece after its copy, instead of on a pool thread beside
///   one big write, saved 0.2 ms of 3.8 on 10 MB (the two shared the
///   memory bus).
const piece_bytes = 2 << 20;

/// The checksums of the full blocks an append completes.
const SumsJob = struct {
    old: []const u8,
    payload: []const u8,
    first: u64,
    sums: []u64,

    fn run(job: *SumsJob, start: u64, end: u64) void {
        assert(start <= end and end <= job.sums.len);
        var scratch: [block_bytes]u8 = undefined;
        for (start..end) |k| {
            const block = job.first + k;
            const bytes = assemble(
                job.old,
                job.payload,
                block * block_bytes,
                (block + 1) * block_bytes,
                &scratch,
            );
            job.sums[k] = format.blockChecksum(block, bytes);
        }
    }
};

fn openOrCreate(context: Context, creating: bool, kind: format.FileKind, id: u64) Error!io.File {
    assert(kind == .data or kind == .sums);
    if (creating) return commit.createFile(context, kind, id);
    return commit.openFile(context, kind, id);
}

/// Writes a new data file (and block sums) for a fixed store from `plan`,
/// for store.zig to commit (then the old files go).
pub fn rewrite(context: Context, new_count: u64, plan: anytype) Error!Next {
    const current = context.head;
    assert(current.layout() == .fixed);
    try requireSound(current, "delete");
    var next = current.superblock;
    const id = next.generation + 1;
    const data = try commit.createFile(context, .data, id);
    defer io.closeFile(data);
    const sums_file = try commit.createFile(context, .sums, id);
    defer io.closeFile(sums_file);
    const stride = next.record_bytes;
    const written = try plans.streamRows(data, sums_file, new_count, stride, plan);
    assert(written.bytes == new_count * stride);
    try commit.syncFile(context, data);
    try commit.syncFile(context, sums_file);
    try commit.syncDir(context);
    next.data_file = id;
    next.sums_file = id;
    next.record_count = new_count;
    next.data_bytes = written.bytes;
    next.live_bytes = written.bytes;
    next.tail_checksum = written.tail_checksum;
    assert(next.data_bytes == next.record_count * next.record_bytes);
    return .{ .superblock = next, .replaced = current.superblock };
}

/// Turns a fixed store into an indexed one: one entry per record, pointing
/// into the same data file: the next superblock, committed on its own.
pub fn convertToIndexed(context: Context) Error!Next {
    const current = context.head;
    assert(current.layout() == .fixed);
    try requireSound(current, "write");
    const plan = plans.ConvertPlan{
        .old = current.dataBytes(),
        .stride = current.superblock.record_bytes,
    };
    var next = current.superblock;
    const id = next.generation + 1;
    const index = try commit.createFile(context, .index, id);
    defer io.closeFile(index);
    _ = try plans.streamRows(index, null, current.count(), @sizeOf(Entry), &plan);
    try commit.syncFile(context, index);
    try commit.syncDir(context);
    next.layout = @intFromEnum(Layout.indexed);
    next.index_file = id;
    next.record_bytes = 0;
    next.sums_file = 0;
    next.tail_checksum = 0;
    // An indexed store replaces by copy: its journal goes with the sums.
    next.journal_file = 0;
    next.journal_sequence = 0;
    // The commit closes the writer's journal (commit.finish).
    assert(next.record_count == current.count() and next.live_bytes <= next.data_bytes);
    return .{ .superblock = next, .replaced = current.superblock };
}

/// Refuses (error.Corrupt) to carry a fixed store's bytes into new
/// checksums while a block does not match its own: the copy would bless
/// the damage, and `verify` would pass from then on. O(data bytes), as the
/// rewrite or conversion that follows.
fn requireSound(current: *const Snapshot, what: []const u8) Error!void {
    const block = integrity.firstUnsoundBlock(current) orelse return;
    return damagedBlock(current, block, what);
}

fn damagedBlock(current: *const Snapshot, block: u64, what: []const u8) Error {
    const stride = current.superblock.record_bytes;
    assert(stride > 0);
    const end = @min((block + 1) * block_bytes, current.superblock.data_bytes);
    return integrity.damagedBlock(block, block * block_bytes / stride, (end - 1) / stride, what);
}
