//! The parts of libzstd (and its zdict trainer) that loaderx calls, declared
//! by hand against the stable zstd API (zstd.h / zdict.h, v1.4+). The library
//! is the system's `libzstd.so.1`, linked by path in build.zig.

pub const CCtx = opaque {};
pub const DCtx = opaque {};
pub const CDict = opaque {};
pub const DDict = opaque {};

pub extern fn ZSTD_compressBound(source_bytes: usize) usize;
pub extern fn ZSTD_isError(code: usize) c_uint;
pub extern fn ZSTD_getErrorName(code: usize) [*:0]const u8;

pub extern fn ZSTD_createCCtx() ?*CCtx;
pub extern fn ZSTD_freeCCtx(context: ?*CCtx) usize;
pub extern fn ZSTD_compressCCtx(
    context: *CCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    level: c_int,
) usize;
pub extern fn ZSTD_compress_usingCDict(
    context: *CCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    dictionary: *const CDict,
) usize;

pub extern fn ZSTD_createDCtx() ?*DCtx;
pub extern fn ZSTD_freeDCtx(context: ?*DCtx) usize;
pub extern fn ZSTD_decompressDCtx(
    context: *DCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
) usize;
pub extern fn ZSTD_decompress_usingDDict(
    context: *DCtx,
    target: [*]u8,
    target_capacity: usize,
    source: [*]const u8,
    source_bytes: usize,
    dictionary: *const DDict,
) usize;

pub extern fn ZSTD_createCDict(
    dictionary: [*]const u8,
    dictionary_bytes: usize,
    level: c_int,
) ?*CDict;
pub extern fn ZSTD_freeCDict(dictionary: ?*CDict) usize;
pub extern fn ZSTD_createDDict(dictionary: [*]const u8, dictionary_bytes: usize) ?*DDict;
pub extern fn ZSTD_freeDDict(dictionary: ?*DDict) usize;

pub extern fn ZDICT_trainFromBuffer(
    dictionary: [*]u8,
    dictionary_capacity: usize,
    samples: [*]const u8,
    sample_sizes: [*]const usize,
    sample_count: c_uint,
) usize;
pub extern fn ZDICT_isError(code: usize) c_uint;
pub extern fn ZDICT_getDictID(dictionary: [*]const u8, dictionary_bytes: usize) c_uint;

pub fn isError(code: usize) bool {
    return ZSTD_isError(code) != 0;
}
