//! The decode ceilings of `scripts/bench.py codecs`: one core of the system
//! libzstd / liblz4 decoding, in a tight native loop, the very payloads a
//! store holds (each record compressed by zig/codec.zig, as an append does).
//! No Python call, no index lookup, no unshuffle: no store can decode these
//! payloads faster on one core.
//!
//!   codec_ceiling RECORDS_FILE RECORD_BYTES ROUNDS [--batches FILE SIZE] CODEC...
//!
//! reads RECORDS_FILE (records of RECORD_BYTES back to back) and compresses
//! each with every CODEC (names of format.Codec). Each round then decodes all
//! records once per codec, codec after codec, so a burst of load on a shared
//! machine hits the codecs of a round alike: first with the library alone,
//! then with loaderx's codec.decode (unshuffle included). One line per codec:
//! `<codec> <payload bytes> <library seconds per round...> | <codec.decode
//! seconds per round...>`.
//!
//! That in-order pass decodes into one record-sized buffer that stays in the
//! core's cache and reads the payloads front to back: more than a gather of
//! random batches can reach. With `--batches`, FILE holds the batches' record
//! indices (little-endian int64, SIZE per batch, as a bench draws them) and
//! each round also decodes every batch, each record into its slot of one
//! batch-sized buffer reused across batches (as a loader's batch is): the
//! library alone, then codec.decode. The line then goes on with ` | <library
//! seconds per round over all batches...> | <codec.decode seconds...>`.
//!
//! `--batches FILE SIZE --ring BUFFERS --threads THREADS` is a loader's
//! ceiling instead: batch k goes into buffer k mod BUFFERS of a ring (a
//! prefetching loader's batches outlive their decode, so they do not stay in
//! the cache as one reused buffer does), and THREADS threads decode the
//! batches side by side, thread t the batches t, t + THREADS, ..., each with
//! its own decoder, sharing the memory bus as a loader's threads do. The
//! batch seconds are then the wall time of all threads.
const std = @import("std");
const codec = @import("codec");
const clib = codec.clib;

// A short-lived process: what it allocates is freed when it exits.
const allocator = std.heap.c_allocator;

const Payloads = struct {
    record_codec: codec.Codec,
    bound: usize,
    frames: []u8,
    sizes: []usize,
    bytes: usize = 0,
    library: []u64,
    ours: []u64,
    batch_library: []u64,
    batch_ours: []u64,
};

pub fn main() !void {
    const arguments = try std.process.argsAlloc(allocator);
    defer std.process.argsFree(allocator, arguments);
    if (arguments.len < 5) return error.Usage;
    const record_bytes = try std.fmt.parseInt(usize, arguments[2], 10);
    const rounds = try std.fmt.parseInt(usize, arguments[3], 10);
    const source = try std.fs.cwd().readFileAlloc(allocator, arguments[1], 1 << 34);
    const count = source.len / record_bytes;
    var names = arguments[4..];
    var batch_size: usize = 0;
    var indices: []usize = &.{};
    if (std.mem.eql(u8, names[0], "--batches")) {
        if (names.len < 4) return error.Usage;
        batch_size = try std.fmt.parseInt(usize, names[2], 10);
        indices = try readIndices(names[1], count);
        if (batch_size == 0 or indices.len % batch_size != 0) return error.PartialBatch;
        names = names[3..];
    }
    var ring: usize = 1;
    var threads: usize = 1;
    if (names.len >= 4 and std.mem.eql(u8, names[0], "--ring")) {
        if (!std.mem.eql(u8, names[2], "--threads")) return error.Usage;
        ring = try std.fmt.parseInt(usize, names[1], 10);
        threads = try std.fmt.parseInt(usize, names[3], 10);
        if (ring == 0 or threads == 0 or batch_size == 0) return error.Usage;
        names = names[4..];
    }
    if (names.len == 0) return error.Usage;
    var scratch: codec.Scratch = .{};
    const encoder = try codec.takeEncoder();
    const all = try allocator.alloc(Payloads, names.len);
    for (all, names) |*payloads, name| {
        const record_codec = std.meta.stringToEnum(codec.Codec, name) orelse
            return error.UnknownCodec;
        const bound = codec.compressBound(record_codec, record_bytes);
        payloads.* = .{
            .record_codec = record_codec,
            .bound = bound,
            .frames = try allocator.alloc(u8, bound * count),
            .sizes = try allocator.alloc(usize, count),
            .library = try allocator.alloc(u64, rounds),
            .ours = try allocator.alloc(u64, rounds),
            .batch_library = try allocator.alloc(u64, rounds),
            .batch_ours = try allocator.alloc(u64, rounds),
        };
        // Every record in its own slot, as a store's append compresses it.
        for (0..count) |k| {
            payloads.sizes[k] = try codec.compress(
                encoder,
                record_codec,
                null,
                source[k * record_bytes ..][0..record_bytes],
                payloads.frames[k * bound ..][0..bound],
                &scratch,
            );
            payloads.bytes += payloads.sizes[k];
        }
    }
    const decoder = try codec.takeDecoder();
    const target = try allocator.alloc(u8, record_bytes);
    // Touched once, so no pass pays for first-touch page faults.
    const ring_buffers = try allocator.alloc(u8, ring * batch_size * record_bytes);
    @memset(ring_buffers, 0);
    for (0..rounds) |round| {
        for (all) |*payloads| {
            var timer = try std.time.Timer.start();
            for (0..count) |k| {
                const frame = payloads.frames[k * payloads.bound ..][0..payloads.sizes[k]];
                const written = try libraryDecode(decoder, payloads.record_codec, frame, target);
                if (written != record_bytes) return error.FrameDidNotDecode;
            }
            payloads.library[round] = timer.lap();
            for (0..count) |k| {
                const frame = payloads.frames[k * payloads.bound ..][0..payloads.sizes[k]];
                try codec.decode(decoder, payloads.record_codec, null, frame, target, &scratch);
            }
            payloads.ours[round] = timer.lap();
            if (batch_size == 0) continue;
            const batches: Batches = .{
                .payloads = payloads,
                .indices = indices,
                .batch_size = batch_size,
                .record_bytes = record_bytes,
                .ring = ring_buffers,
            };
            payloads.batch_library[round] = try batches.wallTime(threads, true);
            payloads.batch_ours[round] = try batches.wallTime(threads, false);
        }
    }
    var buffer: [4096]u8 = undefined;
    var stdout = std.fs.File.stdout().writer(&buffer);
    const out = &stdout.interface;
    for (all) |payloads| {
        try out.print("{s} {d}", .{ @tagName(payloads.record_codec), payloads.bytes });
        for (payloads.library) |nanoseconds| try out.print(" {d}", .{nanoseconds});
        try out.print(" |", .{});
        for (payloads.ours) |nanoseconds| try out.print(" {d}", .{nanoseconds});
        if (batch_size != 0) {
            try out.print(" |", .{});
            for (payloads.batch_library) |nanoseconds| try out.print(" {d}", .{nanoseconds});
            try out.print(" |", .{});
            for (payloads.batch_ours) |nanoseconds| try out.print(" {d}", .{nanoseconds});
        }
        try out.print("\n", .{});
    }
    try out.flush();
}

/// The batch passes of one codec: every batch of `indices`, each record into
/// its slot of the ring buffer its batch number picks.
const Batches = struct {
    payloads: *const Payloads,
    indices: []const usize,
    batch_size: usize,
    record_bytes: usize,
    ring: []u8,

    /// Nanoseconds for `threads` threads to decode every batch, with the
    /// library alone or with codec.decode.
    fn wallTime(batches: Batches, threads: usize, library: bool) !u64 {
        const spawned = try allocator.alloc(std.Thread, threads - 1);
        defer allocator.free(spawned);
        const failures = try allocator.alloc(?anyerror, threads);
        defer allocator.free(failures);
        @memset(failures, null);
        var timer = try std.time.Timer.start();
        var started: usize = 0;
        defer for (spawned[0..started]) |thread| thread.join();
        for (spawned, 1..) |*thread, first| {
            thread.* = try std.Thread.spawn(.{}, pass, .{ batches, first, threads, library, &failures[first] });
            started += 1;
        }
        pass(batches, 0, threads, library, &failures[0]);
        for (spawned) |thread| thread.join();
        started = 0;
        const elapsed = timer.read();
        for (failures) |failure| if (failure) |err| return err;
        return elapsed;
    }

    fn pass(batches: Batches, first: usize, step: usize, library: bool, failure: *?anyerror) void {
        batches.decodeEvery(first, step, library) catch |err| {
            failure.* = err;
        };
    }

    /// Batches first, first + step, ... on the calling thread.
    fn decodeEvery(batches: Batches, first: usize, step: usize, library: bool) !void {
        const decoder = try codec.takeDecoder();
        defer codec.giveDecoder(decoder);
        var scratch: codec.Scratch = .{};
        defer scratch.deinit();
        const payloads = batches.payloads;
        const batch_bytes = batches.batch_size * batches.record_bytes;
        const ring_count = batches.ring.len / batch_bytes;
        var number = first;
        while (number * batches.batch_size < batches.indices.len) : (number += step) {
            const batch = batches.ring[(number % ring_count) * batch_bytes ..][0..batch_bytes];
            const records = batches.indices[number * batches.batch_size ..][0..batches.batch_size];
            for (records, 0..) |k, slot| {
                const frame = payloads.frames[k * payloads.bound ..][0..payloads.sizes[k]];
                const into = batch[slot * batches.record_bytes ..][0..batches.record_bytes];
                if (library) {
                    const written = try libraryDecode(decoder, payloads.record_codec, frame, into);
                    if (written != batches.record_bytes) return error.FrameDidNotDecode;
                } else {
                    try codec.decode(decoder, payloads.record_codec, null, frame, into, &scratch);
                }
            }
        }
    }
};

/// The record indices in `path` (little-endian int64), each below `count`.
fn readIndices(path: []const u8, count: usize) ![]usize {
    const bytes = try std.fs.cwd().readFileAlloc(allocator, path, 1 << 34);
    if (bytes.len % 8 != 0) return error.PartialIndex;
    const indices = try allocator.alloc(usize, bytes.len / 8);
    for (indices, 0..) |*index, k| {
        const value = std.mem.readInt(i64, bytes[k * 8 ..][0..8], .little);
        if (value < 0 or value >= count) return error.IndexOutOfRange;
        index.* = @intCast(value);
    }
    return indices;
}

/// One library call that decodes `frame` into `target`; the bytes written.
fn libraryDecode(
    decoder: *codec.Decoder,
    record_codec: codec.Codec,
    frame: []const u8,
    target: []u8,
) !usize {
    switch (record_codec.coder()) {
        .zstd => {
            const written = clib.ZSTD_decompressDCtx(
                decoder.zstd,
                target.ptr,
                target.len,
                frame.ptr,
                frame.len,
            );
            return if (clib.zstdIsError(written)) error.Corrupt else written;
        },
        .lz4 => {
            var written = target.len;
            var read = frame.len;
            const options: clib.LZ4F_decompressOptions_t = .{ .stableDst = 1 };
            const left = clib.LZ4F_decompress(
                decoder.lz4,
                target.ptr,
                &written,
                frame.ptr,
                &read,
                &options,
            );
            return if (left != 0) error.Corrupt else written;
        },
        else => return error.UnsupportedCodec,
    }
}
