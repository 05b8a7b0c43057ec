//! The decode ceilings of `scripts/bench.py codecs`: one core of the system
//! libzstd / liblz4 decoding, in a tight native loop, the very payloads a
//! store holds (each record compressed by zig/codec.zig, as an append does).
//! No Python call, no index lookup, no unshuffle: no store can decode these
//! payloads faster on one core.
//!
//!   codec_ceiling RECORDS_FILE RECORD_BYTES ROUNDS CODEC...
//!
//! reads RECORDS_FILE (records of RECORD_BYTES back to back) and compresses
//! each with every CODEC (names of format.Codec). Each round then decodes all
//! records once per codec, codec after codec, so a burst of load on a shared
//! machine hits the codecs of a round alike: first with the library alone,
//! then with loaderx's codec.decode (unshuffle included). One line per codec:
//! `<codec> <payload bytes> <library seconds per round...> | <codec.decode
//! seconds per round...>`.
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
};

pub fn main() !void {
    const arguments = try std.process.argsAlloc(allocator);
    defer std.process.argsFree(allocator, arguments);
    if (arguments.len < 5) return error.Usage;
    const record_bytes = try std.fmt.parseInt(usize, arguments[2], 10);
    const rounds = try std.fmt.parseInt(usize, arguments[3], 10);
    const source = try std.fs.cwd().readFileAlloc(allocator, arguments[1], 1 << 34);
    const count = source.len / record_bytes;
    var scratch: codec.Scratch = .{};
    const encoder = try codec.takeEncoder();
    const all = try allocator.alloc(Payloads, arguments.len - 4);
    for (all, arguments[4..]) |*payloads, name| {
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
        try out.print("\n", .{});
    }
    try out.flush();
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
