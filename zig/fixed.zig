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
const store_module = @import("store.zig");
const Store = store_module.Store;
const Snapshot = @import("snapshot.zig").Snapshot;

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const Layout = format.Layout;
const block_bytes = format.block_bytes;
const assemble = @import("encode.zig").assemble;
const journal = @import("journal.zig");

pub fn append(store: *Store, payload: []const u8, record_count: u64, record_bytes: u64) Error!void {
    const current = store.head();
    var next = current.superblock;
    const creating = next.getLayout() == .empty;
    if (creating) {
        next.layout = @intFromEnum(Layout.fixed);
        next.record_bytes = record_bytes;
        next.data_file = next.generation + 1;
        next.sums_file = next.generation + 1;
    }
    const data = if (creating) try commit.createFile(store, .data, next.data_file) else try commit.openFile(store, .data, next.data_file);
    defer io.closeFile(data);
    const sums_file = if (creating) try commit.createFile(store, .sums, next.sums_file) else try commit.openFile(store, .sums, next.sums_file);
    defer io.closeFile(sums_file);

    const old_bytes = current.dataBytes();
    const new_bytes = old_bytes.len + payload.len;
    // Blocks completed by this append get their checksums in the sums
    // file; the new partial tail block's checksum goes in the superblock.
    const first_block = old_bytes.len / block_bytes;
    const full_blocks = new_bytes / block_bytes;
    const sums = allocator.alloc(u64, full_blocks - first_block) catch return error.OutOfMemory;
    defer allocator.free(sums);
    var job = SumsJob{ .old = old_bytes, .payload = payload, .first = first_block, .sums = sums };
    // A durable append, or a store being created (a converter or a save
    // syncs it next), starts the disk on each piece as the next is copied,
    // so the fsync that follows waits for the last piece only. A
    // durable=False append leaves write-back to the kernel until sync().
    try writeSummed(data, &job, old_bytes.len, store.durable or creating);
    if (sums.len > 0) try io.write(sums_file, std.mem.sliceAsBytes(sums), first_block * 8);
    var scratch: [block_bytes]u8 = undefined;
    next.tail_checksum = 0;
    if (new_bytes % block_bytes != 0) {
        const bytes = assemble(old_bytes, payload, full_blocks * block_bytes, new_bytes, &scratch);
        next.tail_checksum = format.blockChecksum(full_blocks, bytes);
    }
    // A durable store gets its journal with its data file, under the same
    // directory sync, so its first replace costs one sync, not four.
    if (creating and store.durable and next.journal_file == 0) {
        next.journal_file = next.data_file;
        next.journal_sequence = 0;
        try journal.createFile(store.dir, next.journal_file, &next);
    }
    try commit.syncFile(store, data);
    try commit.syncFile(store, sums_file);
    if (creating) try commit.syncDir(store);
    if (store.durable) store.writer.?.journal_synced = true;
    next.record_count += record_count;
    next.data_bytes = new_bytes;
    next.live_bytes = new_bytes;
    try commit.commit(store, next);
    // The directory sync above and the commit's superblock sync made a
    // staged store's creation durable too.
    if (creating and store.durable) store.created_unsynced = false;
}

/// Writes the job's payload after `offset` (the old bytes) in pieces that
/// end on multiples of `piece_bytes` in the file, each followed by the
/// checksums of the blocks it completes, so the hash reads rows the copy has
/// just brought into the cache. With `start_writeback` (and a payload of a
/// piece or more) each piece's write-back starts as soon as it is written,
/// so the fsync that follows waits for the last piece only.
fn writeSummed(data: io.File, job: *SumsJob, offset: u64, start_writeback: bool) Error!void {
    const end = offset + job.payload.len;
    var at = offset;
    var summed: u64 = 0;
    while (at < end) {
        const piece_end = @min(end, (at / piece_bytes + 1) * piece_bytes);
        try io.write(data, job.payload[at - offset .. piece_end - offset], at);
        if (start_writeback and job.payload.len >= piece_bytes) io.startWriteback(data, at, piece_end - at);
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
        var scratch: [block_bytes]u8 = undefined;
        for (start..end) |k| {
            const block = job.first + k;
            const bytes = assemble(job.old, job.payload, block * block_bytes, (block + 1) * block_bytes, &scratch);
            job.sums[k] = format.blockChecksum(block, bytes);
        }
    }
};

/// `ascending`: the indices ascend strictly (the caller checked), so the
/// patches need no sort.
pub fn replace(store: *Store, indices: []const u64, ascending: bool, source: []const u8, offsets: []const u64) Error!void {
    const current = store.head();
    // Records of zero bytes: every replace leaves them as they are.
    if (current.superblock.record_bytes == 0) return;
    const patches = allocator.alloc(plans.Patch, indices.len) catch return error.OutOfMemory;
    defer allocator.free(patches);
    const stride = current.superblock.record_bytes;
    for (indices, offsets, patches) |index, offset, *patch| {
        patch.* = .{ .row = index, .bytes = source[offset..][0..stride] };
    }
    if (!ascending) std.mem.sort(plans.Patch, patches, {}, plans.Patch.lessThan);
    try commit.syncBeforeReplace(store);
    if (store.head().superblock.journal_file == 0) try createJournal(store);
    const writer = &store.writer.?;
    const head = store.head();
    // Null only when opening it failed right after the commit that named it.
    if (writer.journal == null) writer.journal = try journal.open(store.dir, &head.superblock, writer.page);
    // A journal past its bound is checkpointed before it takes another
    // record, not right after the record that grew it: the replace that
    // wrote a large record returns without waiting for the data file's
    // write-back, and the checkpoint finds most of it written.
    if (writer.journal.?.end > journal.checkpoint_bytes) try commit.commit(store, head.superblock);
    const base = store.head();
    const target = try commit.replaceTarget(store);
    const handle = &writer.journal.?;
    const tail_checksum = try journal.replace(handle, target, &base.superblock, patches, base.tailChecksum(), &writer.poisoned);
    base.superblock.tail_checksum = tail_checksum;
}

/// Creates the store's journal and commits a superblock that names it: once
/// per store, before its first in-place replace, for a store whose first
/// append did not create it (opened with durable=False, or older).
fn createJournal(store: *Store) Error!void {
    var next = store.head().superblock;
    next.journal_file = next.generation + 1;
    next.journal_sequence = 0;
    try journal.createFile(store.dir, next.journal_file, &next);
    try commit.syncDirNow(store);
    try commit.commitWith(store, next, true);
}

/// Writes a new data file (and block sums) for a fixed store from `plan`,
/// commits it durably and deletes the old files.
pub fn rewrite(store: *Store, new_count: u64, plan: anytype) Error!void {
    const current = store.head();
    var next = current.superblock;
    const id = next.generation + 1;
    const data = try commit.createFile(store, .data, id);
    defer io.closeFile(data);
    const sums_file = try commit.createFile(store, .sums, id);
    defer io.closeFile(sums_file);
    const stride = next.record_bytes;
    const written = try plans.streamRows(data, sums_file, new_count, stride, plan);
    try commit.syncFile(store, data);
    try commit.syncFile(store, sums_file);
    try commit.syncDir(store);
    next.data_file = id;
    next.sums_file = id;
    next.record_count = new_count;
    next.data_bytes = written.bytes;
    next.live_bytes = written.bytes;
    next.tail_checksum = written.tail_checksum;
    try commit.commit(store, next);
    commit.unlinkReplaced(store, current.superblock);
}

/// Turns a fixed store into an indexed one: one entry per record, pointing
/// into the same data file. Committed durably on its own.
pub fn convertToIndexed(store: *Store) Error!void {
    const current = store.head();
    assert(current.layout() == .fixed);
    const plan = plans.ConvertPlan{ .old = current.dataBytes(), .stride = current.superblock.record_bytes };
    var next = current.superblock;
    const id = next.generation + 1;
    const index = try commit.createFile(store, .index, id);
    defer io.closeFile(index);
    _ = try plans.streamRows(index, null, current.count(), @sizeOf(Entry), &plan);
    try commit.syncFile(store, index);
    try commit.syncDir(store);
    next.layout = @intFromEnum(Layout.indexed);
    next.index_file = id;
    next.record_bytes = 0;
    next.sums_file = 0;
    next.tail_checksum = 0;
    // An indexed store replaces by copy: its journal goes with the sums.
    next.journal_file = 0;
    next.journal_sequence = 0;
    try commit.commit(store, next);
    if (store.writer.?.journal) |*handle| {
        handle.close();
        store.writer.?.journal = null;
    }
    commit.unlinkReplaced(store, current.superblock);
}
