//! The decode ceilings of `scripts/bench.py codecs`: one core of the system
//! libzstd / liblz4 decoding, in a tight native loop, the very payloads a
//! store holds (each record compressed by zig/codec.zig, as an append does).
//! No Python call, no index lookup, no unshuffle: no store can decode these
//! payloads faster on one core.
//!
//!   codec_ceiling CODEC RECORDS_FILE RECORD_BYTES RUNS
//!
//! reads RECORDS_FILE (records of RECORD_BYTES back to back), compresses each
//! with CODEC (a name of format.Codec), then prints one line:
//! `<payload bytes> <median decode seconds> <median codec.decode seconds>`,
//! the second timing loaderx's own decode (unshuffle included) of the same
//! payloads on one core.
const std = @import("std");
const codec = @import("codec");
const clib = codec.clib;

const allocator = std.heap.c_allocator;

pub fn main() !void {
    const arguments = try std.process.argsAlloc(allocator);
    defer std.process.argsFree(allocator, arguments);
    if (arguments.len != 5) return error.Usage;
    const record_codec = std.meta.stringToEnum(codec.Codec, arguments[1]) orelse
        return error.UnknownCodec;
    const record_bytes = try std.fmt.parseInt(usize, arguments[3], 10);
    const runs = try std.fmt.parseInt(usize, arguments[4], 10);
    const source = try std.fs.cwd().readFileAlloc(allocator, arguments[2], 1 << 34);
    defer allocator.free(source);
    const count = source.len / record_bytes;

    // Compress every record into its own slot, as a store's append does.
    const bound = codec.compressBound(record_codec, record_bytes);
    const frames = try allocator.alloc(u8, bound * count);
    defer allocator.free(frames);
    const sizes = try allocator.alloc(usize, count);
    defer allocator.free(sizes);
    var scratch: codec.Scratch = .{};
    defer scratch.deinit();
    const encoder = try codec.takeEncoder();
    defer codec.giveEncoder(encoder);
    var payload_bytes: usize = 0;
    for (0..count) |k| {
        sizes[k] = try codec.compress(
            encoder,
            record_codec,
            null,
            source[k * record_bytes ..][0..record_bytes],
            frames[k * bound ..][0..bound],
            &scratch,
        );
        payload_bytes += sizes[k];
    }

    const decoder = try codec.takeDecoder();
    defer codec.giveDecoder(decoder);
    const target = try allocator.alloc(u8, record_bytes);
    defer allocator.free(target);
    const library = try allocator.alloc(u64, runs);
    defer allocator.free(library);
    const ours = try allocator.alloc(u64, runs);
    defer allocator.free(ours);
    for (0..runs) |run| {
        var timer = try std.time.Timer.start();
        for (0..count) |k| {
            const frame = frames[k * bound ..][0..sizes[k]];
            if (try libraryDecode(decoder, record_codec, frame, target) != record_bytes) {
                return error.FrameDidNotDecode;
            }
        }
        library[run] = timer.lap();
        for (0..count) |k| {
            const frame = frames[k * bound ..][0..sizes[k]];
            try codec.decode(decoder, record_codec, null, frame, target, &scratch);
        }
        ours[run] = timer.lap();
    }
    var buffer: [128]u8 = undefined;
    var stdout = std.fs.File.stdout().writer(&buffer);
    try stdout.interface.print("{d} {d:.6} {d:.6}\n", .{
        payload_bytes,
        median(library),
        median(ours),
    });
    try stdout.interface.flush();
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

fn median(nanoseconds: []u64) f64 {
    std.mem.sort(u64, nanoseconds, {}, std.sort.asc(u64));
    return @as(f64, @floatFromInt(nanoseconds[nanoseconds.len / 2])) / 1e9;
}
