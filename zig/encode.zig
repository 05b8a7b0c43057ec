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
const io = @import("io.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const Codec = format.Codec;
const block_bytes = format.block_bytes;

/// Checks a batch a caller hands in: offsets non-decreasing and inside
/// `source`, no record over the size limit. Returns the records' common
/// length when they all have one (the fixed layout takes only those).
pub fn checkBatch(source: []const u8, offsets: []const u64) Error!?u64 {
    if (offsets.len == 0) return status.fail(
        error.InvalidArgument,
        "empty batch: give at least one record",
        .{},
    );
    if (evenStride(source, offsets)) |stride| {
        if (stride <= format.record_bytes_max) return stride;
    }
    var previous: u64 = offsets[0];
    for (offsets, 0..) |offset, k| {
        if (offset < previous or offset > source.len) {
            return status.fail(
                error.InvalidArgument,
                "offsets[{d}] = {d} is not within [offsets[{d}], {d}]: offsets must be " ++
                    "non-decreasing and inside the source",
                .{ k, offset, if (k == 0) 0 else k - 1, source.len },
            );
        }
        previous = offset;
    }
    var common: ?u64 = recordLengthIn(source, offsets, 0);
    for (0..offsets.len) |k| {
        const length = recordLengthIn(source, offsets, k);
        if (length > format.record_bytes_max) {
            return status.fail(
                error.TooLarge,
                "record {d} has {d} bytes; the limit is {d}",
                .{ k, length, format.record_bytes_max },
            );
        }
        if (common != null and length != common.?) common = null;
    }
    return common;
}

/// The stride of offsets that are `offsets[0] + k * stride` with the last
/// record `stride` long too (rows of one array, the common case), else
/// null: one pass the compiler vectorises, where the general checks take
/// three (a millisecond for 500,000 rows).
fn evenStride(source: []const u8, offsets: []const u64) ?u64 {
    const first = offsets[0];
    const last = offsets[offsets.len - 1];
    if (first > last or last > source.len) return null;
    const stride = source.len - last;
    // Bounds every k * stride below by source.len, so nothing wraps.
    if (stride != 0 and offsets.len - 1 > (source.len - first) / stride) return null;
    var mismatch: u64 = 0;
    var expected = first;
    for (offsets) |offset| {
        mismatch |= offset ^ expected;
        expected +%= stride;
    }
    return if (mismatch == 0) stride else null;
}

pub fn recordLengthIn(source: []const u8, offsets: []const u64, k: usize) u64 {
    const end = if (k + 1 < offsets.len) offsets[k + 1] else source.len;
    return end - offsets[k];
}

test "checkBatch returns the common record length, or null, and refuses bad offsets" {
    const source = [_]u8{0} ** 40;
    const even = [_]u64{ 0, 10, 20, 30 };
    try std.testing.expectEqual(@as(?u64, 10), try checkBatch(&source, &even));
    try std.testing.expectEqual(@as(?u64, 40), try checkBatch(&source, &[_]u64{0}));
    try std.testing.expectEqual(@as(?u64, 0), try checkBatch(source[0..0], &[_]u64{ 0, 0, 0 }));
    // Equal steps but a shorter last record, and uneven steps: no common length.
    try std.testing.expectEqual(@as(?u64, null), try checkBatch(source[0..35], &even));
    try std.testing.expectEqual(@as(?u64, null), try checkBatch(&source, &[_]u64{ 0, 10, 25, 30 }));
    // Steps that would wrap around u64 back to a matching last offset.
    const huge: u64 = 1 << 63;
    try std.testing.expectError(error.InvalidArgument, checkBatch(&source, &[_]u64{ 0, huge, 0 }));
    try std.testing.expectError(error.InvalidArgument, checkBatch(&source, &[_]u64{ 0, 30, 20 }));
    try std.testing.expectError(error.InvalidArgument, checkBatch(&source, &[_]u64{ 0, 41 }));
    try std.testing.expectError(error.InvalidArgument, checkBatch(&source, &[_]u64{}));
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
        const encoder = codec.takeEncoder() catch return job.failure.set(
            error.OutOfMemory,
            start,
            "out of memory for a zstd context",
        );
        defer codec.giveEncoder(encoder);
        var shuffled: codec.Scratch = .{};
        defer shuffled.deinit();
        for (start..end) |k| {
            const raw = job.source[job.offsets[k]..][0..recordLengthIn(job.source, job.offsets, k)];
            const slot = job.scratch[job.slots[k]..job.slots[k + 1]];
            job.entries[k] = encodeRecord(
                encoder,
                job.record_codec,
                job.dictionary,
                raw,
                slot,
                &shuffled,
            ) catch |err| {
                return job.failure.set(err, k, compressFailure(err));
            };
        }
    }
};

/// How a batch stores record `raw`: as the frame compressed into `slot`,
/// or raw when no frame shrinks it (not worth decoding), the raw bytes
/// left for the caller to place. The entry's offset is 0 until then.
fn encodeRecord(
    encoder: *codec.Encoder,
    record_codec: Codec,
    dictionary: ?*const codec.Dictionary,
    raw: []const u8,
    slot: []u8,
    shuffled: *codec.Scratch,
) codec.CompressError!Entry {
    const written = try codec.compress(encoder, record_codec, dictionary, raw, slot, shuffled);
    return if (written < raw.len)
        Entry.init(0, raw.len, written, record_codec, slot[0..written])
    else
        Entry.init(0, raw.len, raw.len, .raw, raw);
}

fn compressFailure(err: codec.CompressError) []const u8 {
    return switch (err) {
        error.Codec => "the codec could not compress the record",
        error.OutOfMemory => "out of memory for the shuffled copy of the record",
    };
}

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

pub fn encodeBatch(
    threads: u32,
    dictionary: ?*const codec.Dictionary,
    source: []const u8,
    offsets: []const u64,
    record_codec: Codec,
    base: u64,
) Error!EncodedBatch {
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
        const bound = codec.compressBound(record_codec, recordLengthIn(source, offsets, k));
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

/// Source bytes per piece of a written batch: each piece is compressed into
/// its own buffer, packed as it goes, and written as soon as the pieces
/// before it are, so writing one piece overlaps compressing the next and no
/// core waits for a whole batch's pack and pwrite. Small, because at the
/// end of a batch one thread may wait up to a piece for the other.
const piece_bytes = 256 << 10;

const Piece = struct {
    first: u64,
    end: u64,
    buffer: []u8 = &.{},
    stored: u64 = 0,
    done: std.atomic.Value(bool) = .init(false),
};

/// The pieces of a batch: consecutive records of about `piece_bytes` each.
fn splitPieces(source: []const u8, offsets: []const u64) Error![]Piece {
    var count: u64 = 0;
    var bytes: u64 = 0;
    for (0..offsets.len) |k| {
        bytes += recordLengthIn(source, offsets, k);
        if (bytes >= piece_bytes or k + 1 == offsets.len) {
            count += 1;
            bytes = 0;
        }
    }
    const pieces = allocator.alloc(Piece, count) catch return error.OutOfMemory;
    var first: u64 = 0;
    var index: u64 = 0;
    for (0..offsets.len) |k| {
        bytes += recordLengthIn(source, offsets, k);
        if (bytes >= piece_bytes or k + 1 == offsets.len) {
            pieces[index] = .{ .first = first, .end = k + 1 };
            index += 1;
            first = k + 1;
            bytes = 0;
        }
    }
    assert(index == count);
    return pieces;
}

const WriteJob = struct {
    source: []const u8,
    offsets: []const u64,
    entries: []Entry,
    record_codec: Codec,
    dictionary: ?*const codec.Dictionary,
    pieces: []Piece,
    file: io.File,
    base: u64,
    /// Only the calling thread writes: an I/O error's message is per thread,
    /// and it is the caller that reports it.
    caller: std.Thread.Id,
    next_write: u64 = 0,
    written: u64 = 0,
    /// Bytes from `base` whose write-back has been started.
    written_back: u64 = 0,
    write_error: ?Error = null,
    stopped: std.atomic.Value(bool) = .init(false),
    failure: workers.Failure = .{},

    fn run(job: *WriteJob, start: u64, end: u64) void {
        const encoder = codec.takeEncoder() catch return job.fail(
            error.OutOfMemory,
            job.pieces[start].first,
            "out of memory for a zstd context",
        );
        defer codec.giveEncoder(encoder);
        var shuffled: codec.Scratch = .{};
        defer shuffled.deinit();
        for (job.pieces[start..end]) |*piece| {
            if (job.stopped.load(.monotonic)) return;
            job.compressPiece(encoder, &shuffled, piece) catch return;
            piece.done.store(true, .release);
            if (std.Thread.getCurrentId() == job.caller) job.writeReady();
        }
    }

    fn fail(job: *WriteJob, err: Error, record: u64, reason: []const u8) void {
        job.failure.set(err, record, reason);
        job.stopped.store(true, .monotonic);
    }

    /// Compresses the piece's records back to back into its own buffer
    /// (a record no frame shrinks is copied raw); entry offsets are relative
    /// to the piece until it is written.
    fn compressPiece(
        job: *WriteJob,
        encoder: *codec.Encoder,
        shuffled: *codec.Scratch,
        piece: *Piece,
    ) error{Failed}!void {
        var bound: u64 = 0;
        for (piece.first..piece.end) |k| bound += codec.compressBound(
            job.record_codec,
            recordLengthIn(job.source, job.offsets, k),
        );
        piece.buffer = allocator.alloc(u8, bound) catch {
            job.fail(error.OutOfMemory, piece.first, "out of memory for the compressed records");
            return error.Failed;
        };
        var cursor: u64 = 0;
        for (piece.first..piece.end) |k| {
            const raw = job.source[job.offsets[k]..][0..recordLengthIn(job.source, job.offsets, k)];
            const slot = piece.buffer[cursor..];
            var entry = encodeRecord(
                encoder,
                job.record_codec,
                job.dictionary,
                raw,
                slot,
                shuffled,
            ) catch |err| {
                job.fail(err, k, compressFailure(err));
                return error.Failed;
            };
            if (entry.codec().? == .raw) @memcpy(slot[0..raw.len], raw);
            entry.offset = cursor;
            job.entries[k] = entry;
            cursor += entry.storedBytes();
        }
        piece.stored = cursor;
    }

    /// Writes, in order, every finished piece whose predecessors are written.
    fn writeReady(job: *WriteJob) void {
        while (job.write_error == null and job.next_write < job.pieces.len) {
            const piece = &job.pieces[job.next_write];
            if (!piece.done.load(.acquire)) return;
            const at = job.base + job.written;
            io.write(job.file, piece.buffer[0..piece.stored], at) catch |err| {
                job.write_error = err;
                job.stopped.store(true, .monotonic);
                return;
            };
            for (job.entries[piece.first..piece.end]) |*entry| entry.offset += at;
            job.written += piece.stored;
            job.startWriteback();
            allocator.free(piece.buffer);
            piece.buffer = &.{};
            job.next_write += 1;
        }
    }

    /// Starts the write-back of each `writeback_step` written, so the disk
    /// takes the batch while the rest compresses and the sync that follows
    /// (now or at the end of a conversion) waits for one step at most.
    /// Started for a whole 64 MiB batch at its end, the submission blocked
    /// the caller for 15-27 ms with both cores idle.
    fn startWriteback(job: *WriteJob) void {
        const pending = job.written - job.written_back;
        if (pending < writeback_step) return;
        io.startWriteback(job.file, job.base + job.written_back, pending);
        job.written_back = job.written;
    }
};

const writeback_step = 8 << 20;

/// A batch encoded and written: one entry per record, whose offsets start at
/// `base`, and the payload bytes written from there.
pub const WrittenBatch = struct {
    entries: []Entry,
    payload_bytes: u64,
};

/// Encodes a batch as `encodeBatch` does and writes its payloads to `file`
/// at `base`, piece by piece while the worker threads compress the rest.
/// The caller frees `entries` (with the C allocator).
pub fn writeBatch(
    threads: u32,
    dictionary: ?*const codec.Dictionary,
    source: []const u8,
    offsets: []const u64,
    record_codec: Codec,
    file: io.File,
    base: u64,
) Error!WrittenBatch {
    if (record_codec == .raw) {
        var batch = try encodeBatch(threads, null, source, offsets, .raw, base);
        errdefer batch.deinit();
        try io.write(file, batch.payload, base);
        if (batch.payload.len >= writeback_step) io.startWriteback(file, base, batch.payload.len);
        return .{ .entries = batch.entries, .payload_bytes = batch.payload.len };
    }
    const pieces = try splitPieces(source, offsets);
    defer allocator.free(pieces);
    defer for (pieces) |piece| if (piece.buffer.len > 0) allocator.free(piece.buffer);
    const entries = allocator.alloc(Entry, offsets.len) catch return error.OutOfMemory;
    errdefer allocator.free(entries);
    var job = WriteJob{
        .source = source,
        .offsets = offsets,
        .entries = entries,
        .record_codec = record_codec,
        .dictionary = dictionary,
        .pieces = pieces,
        .file = file,
        .base = base,
        .caller = std.Thread.getCurrentId(),
    };
    workers.parallelForEach(pieces.len, source.len - offsets[0], threads, &job, WriteJob.run);
    if (job.write_error) |err| return err;
    try job.failure.check("cannot compress");
    job.writeReady(); // the pieces the pool threads finished last
    if (job.write_error) |err| return err;
    assert(job.next_write == pieces.len);
    return .{ .entries = entries, .payload_bytes = job.written };
}

test "writeBatch writes what encodeBatch packs, in pieces on two threads; a failed write" {
    const storage = @import("testing/storage.zig");
    storage.reset();
    defer storage.reset();
    const values = try allocator.alloc(u32, 1_200_000);
    defer allocator.free(values);
    for (values, 0..) |*value, index| value.* = @intCast(index * 7 % 1000);
    const source = std.mem.sliceAsBytes(values);
    var offsets: [160]u64 = undefined;
    for (&offsets, 0..) |*offset, k| offset.* = k * 30_000;
    // Record 3 is random bytes, which no frame shrinks: it is stored raw.
    var prng = std.Random.DefaultPrng.init(7);
    prng.random().bytes(source[90_000..120_000]);
    var expected = try encodeBatch(2, null, source, &offsets, .zstd, 512);
    defer expected.deinit();
    try std.testing.expect(expected.entries[3].codec().? == .raw);

    try io.makePath("/pieces");
    const dir = try io.openDir("/pieces");
    defer io.closeDir(dir);
    const file = try io.createFile(dir, "data", true);
    defer io.closeFile(file);
    const written = try writeBatch(2, null, source, &offsets, .zstd, file, 512);
    defer allocator.free(written.entries);
    try std.testing.expect(storage.kindCount(.write) > 1); // more than one piece
    try std.testing.expectEqual(@as(u64, expected.payload.len), written.payload_bytes);
    try std.testing.expectEqualSlices(Entry, expected.entries, written.entries);
    const back = try allocator.alloc(u8, written.payload_bytes);
    defer allocator.free(back);
    try std.testing.expectEqual(back.len, try io.read(file, back, 512));
    try std.testing.expectEqualSlices(u8, expected.payload, back);

    storage.injectFault(.write, storage.kindCount(.write) + 2, .eio);
    try std.testing.expectError(error.Io, writeBatch(2, null, source, &offsets, .zstd, file, 0));
    try std.testing.expect(storage.clearFault());
}

test "writeBatch starts the write-back of each 8 MiB it writes, within what it wrote" {
    const storage = @import("testing/storage.zig");
    storage.reset();
    defer storage.reset();
    // Random bytes: no frame shrinks them, so the payload is the source.
    // (A simulated file holds at most 16 MiB.)
    const source = try allocator.alloc(u8, 12 << 20);
    defer allocator.free(source);
    var prng = std.Random.DefaultPrng.init(11);
    prng.random().bytes(source);
    const offsets = try allocator.alloc(u64, source.len / (64 << 10));
    defer allocator.free(offsets);
    for (offsets, 0..) |*offset, k| offset.* = k * (64 << 10);

    try io.makePath("/writeback");
    const dir = try io.openDir("/writeback");
    defer io.closeDir(dir);
    for ([_]Codec{ .zstd, .raw }) |record_codec| {
        const file = try io.createFile(dir, @tagName(record_codec), true);
        defer io.closeFile(file);
        const calls_before = storage.writebackStarted().calls;
        const base = 4096;
        const written = try writeBatch(2, null, source, offsets, record_codec, file, base);
        defer allocator.free(written.entries);
        try std.testing.expectEqual(@as(u64, source.len), written.payload_bytes);
        // The simulated disk asserts each hint names written bytes.
        const started = storage.writebackStarted();
        try std.testing.expectEqual(calls_before + 1, started.calls);
        try std.testing.expect(started.end >= base + writeback_step);
        try std.testing.expect(started.end <= base + written.payload_bytes);
    }
}

/// The bytes the records of a batch would take in a store with `record_codec`
/// (after the raw fallback of records a frame would not shrink), without
/// writing anything: the converters try codecs on a sample with it.
pub fn encodedBytes(
    threads: u32,
    source: []const u8,
    offsets: []const u64,
    record_codec: Codec,
) Error!u64 {
    _ = try checkBatch(source, offsets);
    if (record_codec.usesDictionary()) {
        return status.fail(
            error.InvalidArgument,
            "cannot try codec '{s}' without a store: its dictionary lives in one",
            .{@tagName(record_codec)},
        );
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
    try std.testing.expectEqual(
        @as(u64, 8),
        try encodedBytes(1, "\x93\x01\xfe\x42\x17\xc8\x5d\xa0", &.{0}, .zstd_shuffle2),
    );
}

/// The bytes [start, end) of the file `old ++ payload`, copied into `scratch`
/// only when the range straddles the two.
pub fn assemble(
    old: []const u8,
    payload: []const u8,
    start: u64,
    end: u64,
    scratch: *[block_bytes]u8,
) []const u8 {
    assert(start <= end and end - start <= block_bytes);
    if (start >= old.len) return payload[start - old.len .. end - old.len];
    if (end <= old.len) return old[start..end];
    const head = old[start..];
    @memcpy(scratch[0..head.len], head);
    const tail = payload[0 .. end - old.len];
    @memcpy(scratch[head.len..][0..tail.len], tail);
    return scratch[0 .. end - start];
}
