//! Record encoding and decoding: raw copies and zstd frames, with pooled zstd
//! contexts so no context is created on the per-record hot path.
const std = @import("std");
const zstd = @import("zstd.zig");
const format = @import("format.zig");
const status = @import("status.zig");
const Error = status.Error;
const Codec = format.Codec;

const allocator = std.heap.c_allocator;

/// A free list of zstd contexts shared by every store and thread. A batch task
/// takes one context for all of its records, so the lock is taken per task,
/// not per record. The list never holds more contexts than tasks ever ran at
/// once (worker threads plus calling threads).
const ContextPool = struct {
    mutex: std.Thread.Mutex = .{},
    decoders: std.ArrayList(*zstd.DCtx) = .empty,
    encoders: std.ArrayList(*zstd.CCtx) = .empty,
};
var contexts: ContextPool = .{};

pub fn takeDecoder() Error!*zstd.DCtx {
    {
        contexts.mutex.lock();
        defer contexts.mutex.unlock();
        if (contexts.decoders.pop()) |decoder| return decoder;
    }
    return zstd.ZSTD_createDCtx() orelse error.OutOfMemory;
}

pub fn giveDecoder(decoder: *zstd.DCtx) void {
    contexts.mutex.lock();
    defer contexts.mutex.unlock();
    contexts.decoders.append(allocator, decoder) catch {
        _ = zstd.ZSTD_freeDCtx(decoder);
    };
}

pub fn takeEncoder() Error!*zstd.CCtx {
    {
        contexts.mutex.lock();
        defer contexts.mutex.unlock();
        if (contexts.encoders.pop()) |encoder| return encoder;
    }
    return zstd.ZSTD_createCCtx() orelse error.OutOfMemory;
}

pub fn giveEncoder(encoder: *zstd.CCtx) void {
    contexts.mutex.lock();
    defer contexts.mutex.unlock();
    contexts.encoders.append(allocator, encoder) catch {
        _ = zstd.ZSTD_freeCCtx(encoder);
    };
}

/// A loaded dictionary, ready for both directions.
pub const Dictionary = struct {
    compress: *zstd.CDict,
    decompress: *zstd.DDict,

    pub fn init(bytes: []const u8) Error!Dictionary {
        const compressor = zstd.ZSTD_createCDict(bytes.ptr, bytes.len, format.zstd_level) orelse
            return error.OutOfMemory;
        errdefer _ = zstd.ZSTD_freeCDict(compressor);
        const decompressor = zstd.ZSTD_createDDict(bytes.ptr, bytes.len) orelse return error.OutOfMemory;
        return .{ .compress = compressor, .decompress = decompressor };
    }

    pub fn deinit(dictionary: Dictionary) void {
        _ = zstd.ZSTD_freeCDict(dictionary.compress);
        _ = zstd.ZSTD_freeDDict(dictionary.decompress);
    }
};

/// Compresses `source` into `target` (at least ZSTD_compressBound bytes) and
/// returns the frame's length. The caller keeps the raw bytes when the frame
/// is not smaller.
pub fn compress(
    encoder: *zstd.CCtx,
    codec: Codec,
    dictionary: ?*const Dictionary,
    source: []const u8,
    target: []u8,
) error{Codec}!usize {
    std.debug.assert(codec != .raw);
    std.debug.assert(target.len >= zstd.ZSTD_compressBound(source.len));
    const written = switch (codec) {
        .zstd => zstd.ZSTD_compressCCtx(encoder, target.ptr, target.len, source.ptr, source.len, format.zstd_level),
        .zstd_dict => zstd.ZSTD_compress_usingCDict(encoder, target.ptr, target.len, source.ptr, source.len, dictionary.?.compress),
        .raw => unreachable,
    };
    if (zstd.isError(written)) return error.Codec;
    return written;
}

/// Decodes one stored payload into `target`, which must be exactly the
/// record's raw length; a frame that decodes to any other length is corrupt.
pub fn decode(
    decoder: ?*zstd.DCtx,
    codec: Codec,
    dictionary: ?*const Dictionary,
    payload: []const u8,
    target: []u8,
) error{ Corrupt, NoDictionary }!void {
    switch (codec) {
        .raw => {
            if (payload.len != target.len) return error.Corrupt;
            @memcpy(target, payload);
        },
        .zstd, .zstd_dict => {
            const context = decoder.?;
            const written = if (codec == .zstd)
                zstd.ZSTD_decompressDCtx(context, target.ptr, target.len, payload.ptr, payload.len)
            else if (dictionary) |loaded|
                zstd.ZSTD_decompress_usingDDict(context, target.ptr, target.len, payload.ptr, payload.len, loaded.decompress)
            else
                return error.NoDictionary;
            if (zstd.isError(written) or written != target.len) return error.Corrupt;
        },
    }
}

test "a zstd round trip through pooled contexts restores the bytes" {
    var source: [4096]u8 = undefined;
    for (&source, 0..) |*byte, index| byte.* = @intCast(index % 7);
    var frame: [8192]u8 = undefined;
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    const frame_bytes = try compress(encoder, .zstd, null, &source, &frame);
    try std.testing.expect(frame_bytes < source.len);
    var target: [4096]u8 = undefined;
    const decoder = try takeDecoder();
    defer giveDecoder(decoder);
    try decode(decoder, .zstd, null, frame[0..frame_bytes], &target);
    try std.testing.expectEqualSlices(u8, &source, &target);
    try std.testing.expectError(error.Corrupt, decode(decoder, .zstd, null, frame[0..frame_bytes], target[0..100]));
}
