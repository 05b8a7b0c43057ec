//! Encoding a batch for the indexed layout: each record compressed on the
//! worker threads (kept raw when a frame would not shrink it), checksummed,
//! and packed back to back with its index entry; and the checks every
//! batch a caller hands in must pass first.
//!
//! Invariant: every entry's checksum covers exactly the payload it points
//! at, and payloads are packed in record order starting at `base`.
const std = @import("std");
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const workers = @import("workers.zig");
const zstd = @import("zstd.zig");
const io = @import("io.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const Codec = format.Codec;
const block_bytes = format.block_bytes;

pub fn checkBatch(source: []const u8, offsets: []const u64) Error!void {
    if (offsets.len == 0) return status.fail(error.InvalidArgument, "empty batch: give at least one record", .{});
    var previous: u64 = offsets[0];
    for (offsets, 0..) |offset, k| {
        if (offset < previous or offset > source.len) {
            return status.fail(error.InvalidArgument, "offsets[{d}] = {d} is not within [offsets[{d}], {d}]: offsets must be non-decreasing and inside the source", .{ k, offset, if (k == 0) 0 else k - 1, source.len });
        }
        previous = offset;
    }
    for (0..offsets.len) |k| {
        const length = recordLengthIn(source, offsets, k);
        if (length > format.record_bytes_max) {
            return status.fail(error.TooLarge, "record {d} has {d} bytes; the limit is {d}", .{ k, length, format.record_bytes_max });
        }
    }
}

pub fn recordLengthIn(source: []const u8, offsets: []const u64, k: usize) u64 {
    const end = if (k + 1 < offsets.len) offsets[k + 1] else source.len;
    return end - offsets[k];
}

pub fn uniformLength(source: []const u8, offsets: []const u64) ?u64 {
    const first = recordLengthIn(source, offsets, 0);
    for (1..offsets.len) |k| {
        if (recordLengthIn(source, offsets, k) != first) return null;
    }
    return first;
}

/// A batch encoded for appending: payloads packed back to back and one entry
/// per record, whose offsets start at `base`.
pub const EncodedBatch = struct {
    payload: []const u8,
    entries: []Entry,
    scratch: []u8,

    pub fn deinit(batch: *EncodedBatch) void {
        allocator.free(batch.entries);
        if (batch.scratch.len > 0) std.heap.page_allocator.free(batch.scratch);
    }
};

const huge_page_bytes = 2 << 20;

/// The frames' scratch: whole pages straight from mmap, marked for 2 MiB pages
/// when large, so compressing into it takes a few page faults per 2 MiB
/// rather than one per 4 KiB (those faults were ~15% of the CPU time of a
/// 64 MiB zstd append).
fn allocScratch(bytes: u64) Error![]u8 {
    const scratch = std.heap.page_allocator.alloc(u8, bytes) catch return error.OutOfMemory;
    if (bytes >= huge_page_bytes) io.advise(scratch, .huge_pages);
    return scratch;
}

const EncodeJob = struct {
    source: []const u8,
    offsets: []const u64,
    slots: []const u64,
    scratch: []u8,
    entries: []Entry,
    record_codec: Codec,
    dictionary: ?*const codec.Dictionary,
    failure: workers.Failure = .{},

    fn run(job: *EncodeJob, start: u64, end: u64) void {
        const encoder = codec.takeEncoder() catch return job.failure.set(error.OutOfMemory, start, "out of memory for a zstd context");
        defer codec.giveEncoder(encoder);
        var shuffled: codec.Scratch = .{};
        defer shuffled.deinit();
        for (start..end) |k| {
            const raw = job.source[job.offsets[k]..][0..recordLengthIn(job.source, job.offsets, k)];
            const slot = job.scratch[job.slots[k]..job.slots[k + 1]];
            const written = codec.compress(encoder, job.record_codec, job.dictionary, raw, slot, &shuffled) catch |err| switch (err) {
                error.Codec => return job.failure.set(error.Codec, k, "zstd could not compress the record"),
                error.OutOfMemory => return job.failure.set(error.OutOfMemory, k, "out of memory for the shuffled copy of the record"),
            };
            // A frame that does not shrink the record is not worth decoding.
            job.entries[k] = if (written < raw.len)
                Entry.init(0, raw.len, written, job.record_codec, slot[0..written])
            else
                Entry.init(0, raw.len, raw.len, .raw, raw);
        }
    }
};

const HashJob = struct {
    source: []const u8,
    offsets: []const u64,
    entries: []Entry,

    fn run(job: *HashJob, start: u64, end: u64) void {
        for (start..end) |k| {
            const length = recordLengthIn(job.source, job.offsets, k);
            const raw = job.source[job.offsets[k]..][0..length];
            job.entries[k] = Entry.init(job.offsets[k] - job.offsets[0], length, length, .raw, raw);
        }
    }
};

pub fn encodeBatch(threads: u32, dictionary: ?*const codec.Dictionary, source: []const u8, offsets: []const u64, record_codec: Codec, base: u64) Error!EncodedBatch {
    const entries = allocator.alloc(Entry, offsets.len) catch return error.OutOfMemory;
    errdefer allocator.free(entries);
    const total = source.len - offsets[0];
    if (record_codec == .raw) {
        var job = HashJob{ .source = source, .offsets = offsets, .entries = entries };
        workers.parallelFor(offsets.len, total, threads, &job, HashJob.run);
        for (entries) |*entry| entry.offset += base;
        return .{ .payload = source[offsets[0]..], .entries = entries, .scratch = &.{} };
    }
    const slots = allocator.alloc(u64, offsets.len + 1) catch return error.OutOfMemory;
    defer allocator.free(slots);
    slots[0] = 0;
    for (0..offsets.len) |k| {
        const bound = zstd.ZSTD_compressBound(recordLengthIn(source, offsets, k));
        slots[k + 1] = std.math.add(u64, slots[k], bound) catch return error.TooLarge;
    }
    const scratch = try allocScratch(slots[offsets.len]);
    errdefer std.heap.page_allocator.free(scratch);
    var job = EncodeJob{
        .source = source,
        .offsets = offsets,
        .slots = slots,
        .scratch = scratch,
        .entries = entries,
        .record_codec = record_codec,
        .dictionary = dictionary,
    };
    workers.parallelFor(offsets.len, total, threads, &job, EncodeJob.run);
    try job.failure.check("cannot compress");
    // Pack the payloads back to back. Each lands at or before its slot, so
    // copying forwards never overwrites a payload not yet moved.
    var cursor: u64 = 0;
    for (entries, 0..) |*entry, k| {
        const stored = entry.storedBytes();
        assert(cursor <= slots[k]);
        if (entry.codec().? == .raw) {
            @memcpy(scratch[cursor..][0..stored], source[offsets[k]..][0..stored]);
        } else {
            std.mem.copyForwards(u8, scratch[cursor..][0..stored], scratch[slots[k]..][0..stored]);
        }
        entry.offset = base + cursor;
        cursor += stored;
    }
    return .{ .payload = scratch[0..cursor], .entries = entries, .scratch = scratch };
}

/// The bytes the records of a batch would take in a store with `record_codec`
/// (after the raw fallback of records a frame would not shrink), without
/// writing anything: the converters try codecs on a sample with it.
pub fn encodedBytes(threads: u32, source: []const u8, offsets: []const u64, record_codec: Codec) Error!u64 {
    try checkBatch(source, offsets);
    if (record_codec.usesDictionary()) {
        return status.fail(error.InvalidArgument, "cannot try codec '{s}' without a store: its dictionary lives in one", .{@tagName(record_codec)});
    }
    var batch = try encodeBatch(threads, null, source, offsets, record_codec, 0);
    defer batch.deinit();
    return batch.payload.len;
}

test "encodedBytes counts the raw fallback and the shuffle's gain" {
    var values: [4096]u32 = undefined;
    for (&values, 0..) |*value, index| value.* = @intCast(100_000 + index * 3);
    const source = std.mem.sliceAsBytes(&values);
    const offsets = [_]u64{ 0, 8192 };
    const plain = try encodedBytes(1, source, &offsets, .zstd);
    const shuffled = try encodedBytes(1, source, &offsets, .zstd_shuffle4);
    try std.testing.expect(shuffled < plain);
    try std.testing.expectEqual(@as(u64, source.len), try encodedBytes(1, source, &offsets, .raw));
    // Eight random bytes do not shrink: the record is counted raw.
    try std.testing.expectEqual(@as(u64, 8), try encodedBytes(1, "\x93\x01\xfe\x42\x17\xc8\x5d\xa0", &.{0}, .zstd_shuffle2));
}

/// The bytes [start, end) of the file `old ++ payload`, copied into `scratch`
/// only when the range straddles the two.
pub fn assemble(old: []const u8, payload: []const u8, start: u64, end: u64, scratch: *[block_bytes]u8) []const u8 {
    assert(start <= end and end - start <= block_bytes);
    if (start >= old.len) return payload[start - old.len .. end - old.len];
    if (end <= old.len) return old[start..end];
    const head = old[start..];
    @memcpy(scratch[0..head.len], head);
    const tail = payload[0 .. end - old.len];
    @memcpy(scratch[head.len..][0..tail.len], tail);
    return scratch[0 .. end - start];
}

