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
    const batch = try allocator.alloc(u8, batch_size * record_bytes);
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
            var start: usize = 0;
            while (start < indices.len) : (start += batch_size) {
                for (indices[start..][0..batch_size], 0..) |k, slot| {
                    const frame = payloads.frames[k * payloads.bound ..][0..payloads.sizes[k]];
                    const into = batch[slot * record_bytes ..][0..record_bytes];
                    const written = try libraryDecode(decoder, payloads.record_codec, frame, into);
                    if (written != record_bytes) return error.FrameDidNotDecode;
                }
            }
            payloads.batch_library[round] = timer.lap();
            start = 0;
            while (start < indices.len) : (start += batch_size) {
                for (indices[start..][0..batch_size], 0..) |k, slot| {
                    const frame = payloads.frames[k * payloads.bound ..][0..payloads.sizes[k]];
                    const into = batch[slot * record_bytes ..][0..record_bytes];
                    try codec.decode(decoder, payloads.record_codec, null, frame, into, &scratch);
                }
            }
            payloads.batch_ours[round] = timer.lap();
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
