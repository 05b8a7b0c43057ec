//! Every C function loaderx calls, declared by hand: the parts of libzstd
//! (and its zdict trainer) against the stable zstd API (zstd.h / zdict.h,
//! v1.4+), and the LZ4 frame API (lz4frame.h, checked against v1.9.4; every
//! function used here is stable since v1.8.0). The libraries are the
//! system's `libzstd.so.1` and `liblz4.so.1`, linked by path in build.zig:
//! no headers are needed to build.

// ---- zstd -----------------------------------------------------------------

pub const ZSTD_CCtx = opaque {};
pub const ZSTD_DCtx = opaque {};
pub const ZSTD_CDict = opaque {};
pub const ZSTD_DDict = opaque {};

pub extern fn ZSTD_compressBound(source_bytes: usize) usize;
pub extern fn ZSTD_isError(code: usize) c_uint;
pub extern fn ZSTD_getErrorName(code: usize) [*:0]const u8;

pub extern fn ZSTD_createCCtx() ?*ZSTD_CCtx;
pub extern fn ZSTD_freeCCtx(context: ?*ZSTD_CCtx) usize;
pub extern fn ZSTD_compressCCtx(
    context: *ZSTD_CCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    level: c_int,
) usize;
pub extern fn ZSTD_compress_usingCDict(
    context: *ZSTD_CCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    dictionary: *const ZSTD_CDict,
) usize;

pub extern fn ZSTD_createDCtx() ?*ZSTD_DCtx;
pub extern fn ZSTD_freeDCtx(context: ?*ZSTD_DCtx) usize;
pub extern fn ZSTD_decompressDCtx(
    context: *ZSTD_DCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
) usize;
pub extern fn ZSTD_decompress_usingDDict(
    context: *ZSTD_DCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    dictionary: *const ZSTD_DDict,
) usize;

pub extern fn ZSTD_createCDict(
    dictionary: [*]const u8,
    dictionary_bytes: usize,
    level: c_int,
) ?*ZSTD_CDict;
pub extern fn ZSTD_freeCDict(dictionary: ?*ZSTD_CDict) usize;
pub extern fn ZSTD_createDDict(dictionary: [*]const u8, dictionary_bytes: usize) ?*ZSTD_DDict;
pub extern fn ZSTD_freeDDict(dictionary: ?*ZSTD_DDict) usize;

pub extern fn ZDICT_trainFromBuffer(
    dictionary: [*]u8,
    dictionary_capacity: usize,
    samples: [*]const u8,
    sample_sizes: [*]const usize,
    sample_count: c_uint,
) usize;
pub extern fn ZDICT_isError(code: usize) c_uint;
pub extern fn ZDICT_getDictID(dictionary: [*]const u8, dictionary_bytes: usize) c_uint;

pub fn zstdIsError(code: usize) bool {
    return ZSTD_isError(code) != 0;
}

// ---- LZ4 frames -------------------------------------------------------------

pub const LZ4F_cctx = opaque {};
pub const LZ4F_dctx = opaque {};

/// LZ4F_VERSION: the API version a context is created for.
pub const LZ4F_version: c_uint = 100;

/// LZ4F_blockSizeID_t values (a C enum: an unsigned int here).
pub const LZ4F_max64KB: c_uint = 4;
pub const LZ4F_max256KB: c_uint = 5;
pub const LZ4F_max1MB: c_uint = 6;
pub const LZ4F_max4MB: c_uint = 7;
/// LZ4F_blockMode_t.
pub const LZ4F_blockIndependent: c_uint = 1;

/// LZ4F_frameInfo_t. The enum fields are C enums (4 bytes).
pub const LZ4F_frameInfo_t = extern struct {
    blockSizeID: c_uint = 0,
    blockMode: c_uint = 0,
    contentChecksumFlag: c_uint = 0,
    frameType: c_uint = 0,
    contentSize: c_ulonglong = 0,
    dictID: c_uint = 0,
    blockChecksumFlag: c_uint = 0,
};

/// LZ4F_preferences_t; zero is the library's default for every field.
pub const LZ4F_preferences_t = extern struct {
    frameInfo: LZ4F_frameInfo_t = .{},
    compressionLevel: c_int = 0,
    autoFlush: c_uint = 0,
    favorDecSpeed: c_uint = 0,
    reserved: [3]c_uint = .{ 0, 0, 0 },
};

/// LZ4F_decompressOptions_t (v1.9.4 names; `skipChecksums` was reserved before).
pub const LZ4F_decompressOptions_t = extern struct {
    stableDst: c_uint = 0,
    skipChecksums: c_uint = 0,
    reserved1: c_uint = 0,
    reserved0: c_uint = 0,
};

pub extern fn LZ4F_isError(code: usize) c_uint;
pub extern fn LZ4F_getErrorName(code: usize) [*:0]const u8;
pub extern fn LZ4F_getVersion() c_uint;
pub extern fn LZ4F_compressFrameBound(
    source_bytes: usize,
    preferences: ?*const LZ4F_preferences_t,
) usize;
pub extern fn LZ4F_compressFrame(
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    preferences: ?*const LZ4F_preferences_t,
) usize;
pub extern fn LZ4F_createDecompressionContext(context: *?*LZ4F_dctx, version: c_uint) usize;
pub extern fn LZ4F_freeDecompressionContext(context: *LZ4F_dctx) usize;
/// Decodes from `source` (in: bytes available, out: bytes read) into
/// `target` (in: capacity, out: bytes written); returns 0 when a whole frame
/// was decoded, else a hint of the source bytes still expected, or an error.
pub extern fn LZ4F_decompress(
    context: *LZ4F_dctx,
    target: [*]u8,
    target_bytes: *usize,
    source: [*]const u8,
    source_bytes: *usize,
    options: ?*const LZ4F_decompressOptions_t,
) usize;
pub extern fn LZ4F_resetDecompressionContext(context: *LZ4F_dctx) void;

pub fn lz4fIsError(code: usize) bool {
    return LZ4F_isError(code) != 0;
}

test "the extern structs have the C layout of lz4frame.h" {
    const std = @import("std");
    try std.testing.expectEqual(32, @sizeOf(LZ4F_frameInfo_t));
    try std.testing.expectEqual(24, @offsetOf(LZ4F_frameInfo_t, "dictID"));
    try std.testing.expectEqual(56, @sizeOf(LZ4F_preferences_t));
    try std.testing.expectEqual(16, @sizeOf(LZ4F_decompressOptions_t));
}
