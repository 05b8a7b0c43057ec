//! Record encoding and decoding: raw copies and zstd frames, optionally of
//! the record byte-shuffled by its element size (shuffle.zig), with pooled
//! zstd contexts so no context is created on the per-record hot path.
const std = @import("std");
const zstd = @import("zstd.zig");
const shuffle = @import("shuffle.zig");
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
        const decompressor = zstd.ZSTD_createDDict(
            bytes.ptr,
            bytes.len,
        ) orelse return error.OutOfMemory;
        return .{ .compress = compressor, .decompress = decompressor };
    }

    pub fn deinit(dictionary: Dictionary) void {
        _ = zstd.ZSTD_freeCDict(dictionary.compress);
        _ = zstd.ZSTD_freeDDict(dictionary.decompress);
    }
};

/// A task's reusable buffer for the shuffled bytes of one record: it grows to
/// the largest record the task meets, so a batch allocates once per task, not
/// once per record.
pub const Scratch = struct {
    bytes: []u8 = &.{},

    pub fn get(scratch: *Scratch, length: usize) error{OutOfMemory}![]u8 {
        if (scratch.bytes.len < length) {
            scratch.deinit();
            scratch.bytes = allocator.alloc(u8, length) catch return error.OutOfMemory;
        }
        return scratch.bytes[0..length];
    }

    pub fn deinit(scratch: *Scratch) void {
        if (scratch.bytes.len > 0) allocator.free(scratch.bytes);
        scratch.bytes = &.{};
    }
};

pub const CompressError = error{ Codec, OutOfMemory };

/// Compresses `source` (shuffled first into `scratch` when the codec says
/// so) into `target` (at least ZSTD_compressBound bytes) and returns the
/// frame's length. The caller keeps the raw bytes when the frame is not
/// smaller.
pub fn compress(
    encoder: *zstd.CCtx,
    codec: Codec,
    dictionary: ?*const Dictionary,
    source: []const u8,
    target: []u8,
    scratch: *Scratch,
) CompressError!usize {
    std.debug.assert(codec != .raw);
    std.debug.assert(target.len >= zstd.ZSTD_compressBound(source.len));
    const input = if (codec.elementBytes() == 1) source else blk: {
        const shuffled = try scratch.get(source.len);
        shuffle.shuffle(codec.elementBytes(), source, shuffled);
        break :blk shuffled;
    };
    const written = if (codec.usesDictionary())
        zstd.ZSTD_compress_usingCDict(
            encoder,
            target.ptr,
            target.len,
            input.ptr,
            input.len,
            dictionary.?.compress,
        )
    else
        zstd.ZSTD_compressCCtx(
            encoder,
            target.ptr,
            target.len,
            input.ptr,
            input.len,
            format.zstd_level,
        );
    if (zstd.isError(written)) return error.Codec;
    return written;
}

/// Decodes one stored payload into `target`, which must be exactly the
/// record's raw length; a frame that decodes to any other length is corrupt.
/// A shuffled record is decoded into `scratch` and unshuffled into `target`.
pub fn decode(
    decoder: ?*zstd.DCtx,
    codec: Codec,
    dictionary: ?*const Dictionary,
    payload: []const u8,
    target: []u8,
    scratch: *Scratch,
) error{ Corrupt, NoDictionary, OutOfMemory }!void {
    if (codec == .raw) {
        if (payload.len != target.len) return error.Corrupt;
        @memcpy(target, payload);
        return;
    }
    const context = decoder.?;
    const element_bytes = codec.elementBytes();
    const frame_target = if (element_bytes == 1) target else try scratch.get(target.len);
    const written = if (!codec.usesDictionary())
        zstd.ZSTD_decompressDCtx(
            context,
            frame_target.ptr,
            frame_target.len,
            payload.ptr,
            payload.len,
        )
    else if (dictionary) |loaded|
        zstd.ZSTD_decompress_usingDDict(
            context,
            frame_target.ptr,
            frame_target.len,
            payload.ptr,
            payload.len,
            loaded.decompress,
        )
    else
        return error.NoDictionary;
    if (zstd.isError(written) or written != target.len) return error.Corrupt;
    if (element_bytes != 1) shuffle.unshuffle(element_bytes, frame_target, target);
}

test {
    _ = shuffle;
}

test "a zstd round trip through pooled contexts restores the bytes" {
    var source: [4096]u8 = undefined;
    for (&source, 0..) |*byte, index| byte.* = @intCast(index % 7);
    var frame: [8192]u8 = undefined;
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    var scratch: Scratch = .{};
    defer scratch.deinit();
    const frame_bytes = try compress(encoder, .zstd, null, &source, &frame, &scratch);
    try std.testing.expect(frame_bytes < source.len);
    var target: [4096]u8 = undefined;
    const decoder = try takeDecoder();
    defer giveDecoder(decoder);
    try decode(decoder, .zstd, null, frame[0..frame_bytes], &target, &scratch);
    try std.testing.expectEqualSlices(u8, &source, &target);
    try std.testing.expectError(
        error.Corrupt,
        decode(decoder, .zstd, null, frame[0..frame_bytes], target[0..100], &scratch),
    );
}

test "a shuffled record is a standard frame of the shuffled bytes, smaller on smooth numbers" {
    // A slowly rising float32 signal: its high bytes repeat, its low bytes do not.
    var values: [2048]f32 = undefined;
    for (&values, 0..) |*value, index| value.* = 1000.0 + @as(f32, @floatFromInt(index)) * 0.37;
    const source = std.mem.sliceAsBytes(&values);
    var shuffled: [8192]u8 = undefined;
    shuffle.shuffle(4, source, &shuffled);
    var plain_frame: [16384]u8 = undefined;
    var shuffled_frame: [16384]u8 = undefined;
    var scratch: Scratch = .{};
    defer scratch.deinit();
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    const plain_bytes = try compress(encoder, .zstd, null, source, &plain_frame, &scratch);
    const shuffled_bytes = try compress(
        encoder,
        .zstd_shuffle4,
        null,
        source,
        &shuffled_frame,
        &scratch,
    );
    try std.testing.expect(shuffled_bytes < plain_bytes);
    // Plain ZSTD_decompress (no loaderx state) yields the shuffled bytes.
    var frame_content: [8192]u8 = undefined;
    const decoder = try takeDecoder();
    defer giveDecoder(decoder);
    try decode(decoder, .zstd, null, shuffled_frame[0..shuffled_bytes], &frame_content, &scratch);
    try std.testing.expectEqualSlices(u8, &shuffled, &frame_content);
    var target: [8192]u8 = undefined;
    try decode(decoder, .zstd_shuffle4, null, shuffled_frame[0..shuffled_bytes], &target, &scratch);
    try std.testing.expectEqualSlices(u8, source, &target);
}
