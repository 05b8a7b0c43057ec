//! Record encoding and decoding: raw copies, zstd frames and LZ4 frames,
//! optionally of the record byte-shuffled by its element size (shuffle.zig),
//! with pooled contexts so no context is created on the per-record hot path.
//!
//! An LZ4 record is one LZ4 frame (lz4frame.h) that `lz4 -d` or any LZ4F
//! decoder reads: independent 64 KiB blocks, the content size in the header
//! (8 bytes; the decoder then also checks the decoded length), no block or
//! content checksum (the index entry's checksum covers the payload, and an
//! xxHash32 of the content would cost decode time the codec exists to save),
//! compression level 0 (LZ4's fast default: LZ4HC writes at tens of MB/s).
const std = @import("std");
/// Public for scripts/codec_ceiling.zig, which times the libraries alone.
pub const clib = @import("clib.zig");
const shuffle = @import("shuffle.zig");
const format = @import("format.zig");
const status = @import("status.zig");
const Error = status.Error;
pub const Codec = format.Codec;

const allocator = std.heap.c_allocator;

/// A compression context: zstd's. LZ4F_compressFrame keeps its state on the
/// stack, so LZ4 needs none.
pub const Encoder = clib.ZSTD_CCtx;

/// A decompression context for every coder: one zstd and one LZ4F context.
pub const Decoder = struct {
    zstd: *clib.ZSTD_DCtx,
    lz4: *clib.LZ4F_dctx,

    fn create() Error!*Decoder {
        const zstd = clib.ZSTD_createDCtx() orelse return error.OutOfMemory;
        errdefer _ = clib.ZSTD_freeDCtx(zstd);
        var lz4: ?*clib.LZ4F_dctx = null;
        if (clib.lz4fIsError(clib.LZ4F_createDecompressionContext(&lz4, clib.LZ4F_version))) {
            return error.OutOfMemory;
        }
        errdefer _ = clib.LZ4F_freeDecompressionContext(lz4.?);
        const decoder = allocator.create(Decoder) catch return error.OutOfMemory;
        decoder.* = .{ .zstd = zstd, .lz4 = lz4.? };
        return decoder;
    }

    fn destroy(decoder: *Decoder) void {
        _ = clib.ZSTD_freeDCtx(decoder.zstd);
        _ = clib.LZ4F_freeDecompressionContext(decoder.lz4);
        allocator.destroy(decoder);
    }
};

/// A free list of contexts shared by every store and thread. A batch task
/// takes one context for all of its records, so the lock is taken per task,
/// not per record. The list never holds more contexts than tasks ever ran at
/// once (worker threads plus calling threads).
const ContextPool = struct {
    mutex: std.Thread.Mutex = .{},
    decoders: std.ArrayList(*Decoder) = .empty,
    encoders: std.ArrayList(*Encoder) = .empty,
};
var contexts: ContextPool = .{};

pub fn takeDecoder() Error!*Decoder {
    {
        contexts.mutex.lock();
        defer contexts.mutex.unlock();
        if (contexts.decoders.pop()) |decoder| return decoder;
    }
    return Decoder.create();
}

pub fn giveDecoder(decoder: *Decoder) void {
    contexts.mutex.lock();
    defer contexts.mutex.unlock();
    contexts.decoders.append(allocator, decoder) catch decoder.destroy();
}

pub fn takeEncoder() Error!*Encoder {
    {
        contexts.mutex.lock();
        defer contexts.mutex.unlock();
        if (contexts.encoders.pop()) |encoder| return encoder;
    }
    return clib.ZSTD_createCCtx() orelse error.OutOfMemory;
}

pub fn giveEncoder(encoder: *Encoder) void {
    contexts.mutex.lock();
    defer contexts.mutex.unlock();
    contexts.encoders.append(allocator, encoder) catch {
        _ = clib.ZSTD_freeCCtx(encoder);
    };
}

/// A loaded dictionary, ready for both directions.
pub const Dictionary = struct {
    compress: *clib.ZSTD_CDict,
    decompress: *clib.ZSTD_DDict,

    pub fn init(bytes: []const u8) Error!Dictionary {
        const compressor = clib.ZSTD_createCDict(bytes.ptr, bytes.len, format.zstd_level) orelse
            return error.OutOfMemory;
        errdefer _ = clib.ZSTD_freeCDict(compressor);
        const decompressor = clib.ZSTD_createDDict(
            bytes.ptr,
            bytes.len,
        ) orelse return error.OutOfMemory;
        return .{ .compress = compressor, .decompress = decompressor };
    }

    pub fn deinit(dictionary: Dictionary) void {
        _ = clib.ZSTD_freeCDict(dictionary.compress);
        _ = clib.ZSTD_freeDDict(dictionary.decompress);
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

/// The LZ4 block size of every frame. LZ4 matches reach back 64 KiB at most,
/// so larger blocks barely change the ratio, and a decoder's buffers stay
/// small.
const lz4_block_bytes = 64 << 10;

fn lz4Preferences(source_bytes: usize) clib.LZ4F_preferences_t {
    return .{ .frameInfo = .{
        .blockSizeID = clib.LZ4F_max64KB,
        .blockMode = clib.LZ4F_blockIndependent,
        .contentSize = source_bytes,
    } };
}

/// The most bytes `compress` may write for a record of `source_bytes`.
pub fn compressBound(codec: Codec, source_bytes: usize) usize {
    return switch (codec.coder()) {
        .raw => source_bytes,
        .zstd, .zstd_dict => clib.ZSTD_compressBound(source_bytes),
        .lz4 => clib.LZ4F_compressFrameBound(source_bytes, &lz4Preferences(source_bytes)),
    };
}

pub const CompressError = error{ Codec, OutOfMemory };

/// Compresses `source` (shuffled first into `scratch` when the codec says
/// so) into `target` (at least `compressBound` bytes) and returns the
/// frame's length. The caller keeps the raw bytes when the frame is not
/// smaller.
pub fn compress(
    encoder: *Encoder,
    codec: Codec,
    dictionary: ?*const Dictionary,
    source: []const u8,
    target: []u8,
    scratch: *Scratch,
) CompressError!usize {
    std.debug.assert(codec != .raw);
    std.debug.assert(target.len >= compressBound(codec, source.len));
    const input = if (codec.elementBytes() == 1) source else blk: {
        const shuffled = try scratch.get(source.len);
        shuffle.shuffle(codec.elementBytes(), source, shuffled);
        break :blk shuffled;
    };
    switch (codec.coder()) {
        .raw => unreachable,
        .lz4 => {
            const written = clib.LZ4F_compressFrame(
                target.ptr,
                target.len,
                input.ptr,
                input.len,
                &lz4Preferences(input.len),
            );
            if (clib.lz4fIsError(written)) return error.Codec;
            return written;
        },
        .zstd, .zstd_dict => {},
    }
    const written = if (codec.usesDictionary())
        clib.ZSTD_compress_usingCDict(
            encoder,
            target.ptr,
            target.len,
            input.ptr,
            input.len,
            dictionary.?.compress,
        )
    else
        clib.ZSTD_compressCCtx(
            encoder,
            target.ptr,
            target.len,
            input.ptr,
            input.len,
            format.zstd_level,
        );
    if (clib.zstdIsError(written)) return error.Codec;
    return written;
}

pub const DecodeError = error{ Corrupt, NoDictionary, OutOfMemory };

/// Decodes one stored payload into `target`, which must be exactly the
/// record's raw length; a frame that decodes to any other length is corrupt.
/// A shuffled record is decoded into `scratch` and unshuffled into `target`.
pub fn decode(
    decoder: ?*Decoder,
    codec: Codec,
    dictionary: ?*const Dictionary,
    payload: []const u8,
    target: []u8,
    scratch: *Scratch,
) DecodeError!void {
    if (codec == .raw) {
        if (payload.len != target.len) return error.Corrupt;
        @memcpy(target, payload);
        return;
    }
    const context = decoder.?;
    const element_bytes = codec.elementBytes();
    if (codec.coder() == .lz4) {
        // LZ4F decodes a block straight into the target only when a whole
        // block still fits there, else through its own buffer and a copy:
        // the scratch (a shuffled record's) has a block to spare.
        const frame_target = if (element_bytes == 1)
            target
        else
            (try scratch.get(target.len + lz4_block_bytes))[0..target.len];
        const capacity = if (element_bytes == 1) target.len else target.len + lz4_block_bytes;
        try decodeLz4(context.lz4, payload, frame_target.ptr, capacity, target.len);
        if (element_bytes != 1) shuffle.unshuffle(element_bytes, frame_target, target);
        return;
    }
    const frame_target = if (element_bytes == 1) target else try scratch.get(target.len);
    const written = if (!codec.usesDictionary())
        clib.ZSTD_decompressDCtx(
            context.zstd,
            frame_target.ptr,
            frame_target.len,
            payload.ptr,
            payload.len,
        )
    else if (dictionary) |loaded|
        clib.ZSTD_decompress_usingDDict(
            context.zstd,
            frame_target.ptr,
            frame_target.len,
            payload.ptr,
            payload.len,
            loaded.decompress,
        )
    else
        return error.NoDictionary;
    if (clib.zstdIsError(written) or written != target.len) return error.Corrupt;
    if (element_bytes != 1) shuffle.unshuffle(element_bytes, frame_target, target);
}

/// Decodes the one LZ4 frame `payload` into `target` (room for `capacity`
/// bytes); the frame must end the payload and hold exactly `expected` bytes.
fn decodeLz4(
    context: *clib.LZ4F_dctx,
    payload: []const u8,
    target: [*]u8,
    capacity: usize,
    expected: usize,
) error{Corrupt}!void {
    var written = capacity;
    var read = payload.len;
    const options: clib.LZ4F_decompressOptions_t = .{ .stableDst = 1 };
    const left = clib.LZ4F_decompress(context, target, &written, payload.ptr, &read, &options);
    if (left != 0 or read != payload.len or written != expected) {
        // An error or a frame cut short leaves the context mid-frame.
        clib.LZ4F_resetDecompressionContext(context);
        return error.Corrupt;
    }
}

/// One buffer (not a store record) encoded with `codec`, which uses no
/// dictionary, through a pooled context: the frame a record of that codec
/// would store, into `target` (at least `compressBound` bytes); returns its
/// length. What pack files compress their data frames with.
pub fn encodeBuffer(codec: Codec, source: []const u8, target: []u8) status.Error!usize {
    std.debug.assert(!codec.usesDictionary());
    std.debug.assert(target.len >= compressBound(codec, source.len));
    if (codec == .raw) {
        @memcpy(target[0..source.len], source);
        return source.len;
    }
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    var scratch: Scratch = .{};
    defer scratch.deinit();
    return compress(encoder, codec, null, source, target, &scratch) catch |err| switch (err) {
        error.OutOfMemory => error.OutOfMemory,
        error.Codec => status.fail(
            error.Codec,
            "{s} could not encode {d} bytes",
            .{ @tagName(codec), source.len },
        ),
    };
}

/// `payload`, a frame `encodeBuffer` wrote with `codec`, decoded into
/// exactly `target`: Corrupt if it is not such a frame of `target.len` bytes.
pub fn decodeBuffer(codec: Codec, payload: []const u8, target: []u8) status.Error!void {
    std.debug.assert(!codec.usesDictionary());
    const decoder = if (codec == .raw) null else try takeDecoder();
    defer if (decoder) |taken| giveDecoder(taken);
    var scratch: Scratch = .{};
    defer scratch.deinit();
    decode(decoder, codec, null, payload, target, &scratch) catch |err| switch (err) {
        error.OutOfMemory => return error.OutOfMemory,
        error.NoDictionary => unreachable,
        error.Corrupt => return status.fail(
            error.Corrupt,
            "{d} bytes are not a {s} frame of {d} bytes",
            .{ payload.len, @tagName(codec), target.len },
        ),
    };
}

test {
    _ = shuffle;
    _ = clib;
}

test "a buffer round-trips through every codec without a dictionary; a damaged frame is Corrupt" {
    var values: [3000]f32 = undefined;
    for (&values, 0..) |*value, index| value.* = @as(f32, @floatFromInt(index % 16)) * 0.25;
    const source = std.mem.sliceAsBytes(&values);
    const frame = try allocator.alloc(u8, compressBound(.lz4_shuffle8, source.len) + 4096);
    defer allocator.free(frame);
    var target: [values.len * 4]u8 = undefined;
    for (std.enums.values(Codec)) |buffer_codec| {
        if (buffer_codec.usesDictionary()) continue;
        const written = try encodeBuffer(buffer_codec, source, frame);
        if (buffer_codec != .raw) try std.testing.expect(written < source.len);
        @memset(&target, 0);
        try decodeBuffer(buffer_codec, frame[0..written], &target);
        try std.testing.expectEqualSlices(u8, source, &target);
        try std.testing.expectError(
            error.Corrupt,
            decodeBuffer(buffer_codec, frame[0..written], target[0 .. target.len - 1]),
        );
        try std.testing.expectError(
            error.Corrupt,
            decodeBuffer(buffer_codec, frame[0 .. written - 1], &target),
        );
    }
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

test "lz4 and lz4_shuffleN round-trip every element size and length near a block edge" {
    var prng = std.Random.DefaultPrng.init(30);
    const source = try allocator.alloc(u8, 3 * lz4_block_bytes + 5);
    defer allocator.free(source);
    // Smooth 16-bit steps with random low bytes: compressible, more so shuffled.
    for (source, 0..) |*byte, index| byte.* = if (index % 2 == 0)
        prng.random().int(u8)
    else
        @intCast(index / 4096);
    const frame = try allocator.alloc(u8, compressBound(.lz4, source.len));
    defer allocator.free(frame);
    const target = try allocator.alloc(u8, source.len);
    defer allocator.free(target);
    var scratch: Scratch = .{};
    defer scratch.deinit();
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    const decoder = try takeDecoder();
    defer giveDecoder(decoder);
    const block = lz4_block_bytes;
    const lengths = [_]usize{ 1, 7, 100, 12288, block - 1, block, block + 1, source.len };
    for ([_]Codec{ .lz4, .lz4_shuffle2, .lz4_shuffle4, .lz4_shuffle8 }) |record_codec| {
        for (lengths) |length| {
            const written = try compress(
                encoder,
                record_codec,
                null,
                source[0..length],
                frame,
                &scratch,
            );
            try std.testing.expect(written <= compressBound(record_codec, length));
            @memset(target, 0xAA);
            try decode(decoder, record_codec, null, frame[0..written], target[0..length], &scratch);
            try std.testing.expectEqualSlices(u8, source[0..length], target[0..length]);
            // A frame for another length, or cut short, or with trailing bytes,
            // is corrupt, and the context decodes the next frame afterwards.
            if (length > 1) try std.testing.expectError(error.Corrupt, decode(
                decoder,
                record_codec,
                null,
                frame[0..written],
                target[0 .. length - 1],
                &scratch,
            ));
            try std.testing.expectError(error.Corrupt, decode(
                decoder,
                record_codec,
                null,
                frame[0 .. written - 1],
                target[0..length],
                &scratch,
            ));
            try std.testing.expectError(error.Corrupt, decode(
                decoder,
                record_codec,
                null,
                frame[0 .. written + 1],
                target[0..length],
                &scratch,
            ));
        }
    }
    // Shuffled records compress better than plain ones on this data.
    const plain = try compress(encoder, .lz4, null, source, frame, &scratch);
    const shuffled = try compress(encoder, .lz4_shuffle2, null, source, frame, &scratch);
    try std.testing.expect(shuffled < plain);
}

test "an lz4 record is a standard LZ4 frame of the shuffled bytes" {
    var values: [3072]f32 = undefined;
    for (&values, 0..) |*value, index| value.* = 1000.0 + @as(f32, @floatFromInt(index)) * 0.37;
    const source = std.mem.sliceAsBytes(&values);
    var frame: [16384]u8 = undefined;
    var scratch: Scratch = .{};
    defer scratch.deinit();
    const encoder = try takeEncoder();
    defer giveEncoder(encoder);
    const written = try compress(encoder, .lz4_shuffle4, null, source, &frame, &scratch);
    // The LZ4 frame magic number, then a header whose FLG byte says: version
    // 01, independent blocks, content size present, no checksums.
    try std.testing.expectEqual(0x184D2204, std.mem.readInt(u32, frame[0..4], .little));
    try std.testing.expectEqual(0b0110_1000, frame[4]);
    try std.testing.expectEqual(source.len, std.mem.readInt(u64, frame[6..14], .little));
    // Plain LZ4F_decompress (no loaderx state) yields the shuffled bytes.
    var context: ?*clib.LZ4F_dctx = null;
    try std.testing.expect(!clib.lz4fIsError(
        clib.LZ4F_createDecompressionContext(&context, clib.LZ4F_version),
    ));
    defer _ = clib.LZ4F_freeDecompressionContext(context.?);
    var content: [12288]u8 = undefined;
    var content_bytes: usize = content.len;
    var read: usize = written;
    try std.testing.expectEqual(0, clib.LZ4F_decompress(
        context.?,
        &content,
        &content_bytes,
        &frame,
        &read,
        null,
    ));
    try std.testing.expectEqual(source.len, content_bytes);
    var expected: [12288]u8 = undefined;
    shuffle.shuffle(4, source, &expected);
    try std.testing.expectEqualSlices(u8, &expected, &content);
}
