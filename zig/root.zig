//! The C ABI of libloaderx: thin `export` wrappers and nothing else. This
//! file is the full list of what Python can call; `src/loaderx/_abi.h`
//! declares the same functions for cffi. Logic lives in store.zig and
//! sampler.zig; errors map to status codes in status.zig.
const std = @import("std");
const status = @import("status.zig");
const format = @import("format.zig");
const store_module = @import("store.zig");
const encode = @import("encode.zig");
const workers = @import("workers.zig");
const ragged = @import("ragged.zig");

/// Bumped whenever the ABI or the on-disk format changes; `_native.py`
/// refuses a library whose version differs from the one it was written for.
pub const abi_version: u32 = 7;

export fn lx_version() u32 {
    return abi_version;
}

/// Copies the message of this thread's last failure (NUL-terminated, cut to
/// fit) and returns its full length.
export fn lx_error_message(target: [*]u8, capacity: usize) usize {
    return copyText(status.message(), target, capacity);
}

/// The errno of the OS failure behind this thread's last failure, or 0.
export fn lx_error_errno() i32 {
    return status.osErrno();
}

fn copyText(text: []const u8, target: [*]u8, capacity: usize) usize {
    if (capacity > 0) {
        const copied = @min(text.len, capacity - 1);
        @memcpy(target[0..copied], text[0..copied]);
        target[copied] = 0;
    }
    return text.len;
}

fn result(outcome: status.Error!void) c_int {
    if (outcome) |_| {
        return status.ok;
    } else |err| {
        _ = status.failDefault(err, "{s}", .{@errorName(err)});
        return @intFromEnum(status.code(err));
    }
}

export fn lx_store_info_bytes() u64 {
    return @sizeOf(store_module.Info);
}

/// The limits of the core, defined once here and read by Python at import.
const Limits = extern struct {
    record_bytes_max: u64,
    record_count_max: u64,
    dict_bytes_min: u64,
    dict_bytes_max: u64,
    sampler_length_max: u64,
    sampler_groups_max: u64,
};

comptime {
    std.debug.assert(@sizeOf(Limits) == 48);
}

export fn lx_limits(out: *Limits) void {
    out.* = .{
        .record_bytes_max = format.record_bytes_max,
        .record_count_max = format.record_count_max,
        .dict_bytes_min = format.dict_bytes_min,
        .dict_bytes_max = format.dict_bytes_max,
        .sampler_length_max = sampler.length_max,
        .sampler_groups_max = sampler.groups_max,
    };
}

// ---- zrecord -------------------------------------------------------------

const Store = store_module.Store;

fn slice(comptime T: type, pointer: ?[*]const T, len: u64) []const T {
    if (len == 0) return &.{};
    return pointer.?[0..len];
}

/// `slice` for a buffer the call writes into.
fn sliceMut(comptime T: type, pointer: ?[*]T, len: u64) []T {
    if (len == 0) return &.{};
    return pointer.?[0..len];
}

fn codecFrom(value: u32) status.Error!format.Codec {
    return format.Codec.from(value) orelse
        status.fail(
            error.InvalidArgument,
            "unknown codec {d}: use 0 (raw), 1 (zstd), 2 (zstd_dict), 3 (lz4), or one of " ++
                "the last three byte-shuffled by 2, 4 or 8-byte elements (0x11, 0x21, 0x31 " ++
                "for zstd; 0x12, 0x22, 0x32 for zstd_dict; 0x13, 0x23, 0x33 for lz4)",
            .{value},
        );
}

/// `flags`: bit 0 verifies every read against its checksum; bit 1 opens
/// with durable=False (fsync deferred to sync() and close()); bit 2 opens a
/// staged store (Store.openWith: a new one is not durable until sync());
/// bit 3 opens an existing store only (no superblock: NotAStore, nothing
/// created); bit 4 checks the records of the indexed layout on read (bit 0
/// checks every read).
export fn lx_store_open(path: [*:0]const u8, threads: u32, flags: u32, out: *?*Store) c_int {
    status.clear();
    out.* = null;
    const missing: Store.Missing = if (flags & 8 != 0)
        .refuse
    else if (flags & 4 != 0)
        .create_staged
    else
        .create;
    const store = Store.openWith(
        std.mem.span(path),
        threads,
        flags & 1 != 0,
        flags & 2 == 0,
        missing,
    ) catch |err| return result(err);
    store.verify_indexed_reads = flags & 16 != 0;
    out.* = store;
    return status.ok;
}

/// `lx_store_open` of an existing store (flags as there, LX_OPEN_EXISTING
/// implied) that first reads the directory's file `side_name` (a dataset's
/// schema) into `side`, through the directory handle the store opens by,
/// and gives the (device, inode) of that directory in `identity` and the
/// store's `lx_store_info_get` in `info`. `side_bytes` is the bytes read
/// (up to `side_capacity`); it is UINT64_MAX, and `out` null, where the
/// directory has no such file.
export fn lx_store_open_beside(
    path: [*:0]const u8,
    threads: u32,
    flags: u32,
    side_name: [*:0]const u8,
    side: [*]u8,
    side_capacity: usize,
    side_bytes: *u64,
    identity: *[2]u64,
    info: *store_module.Info,
    out: *?*Store,
) c_int {
    status.clear();
    out.* = null;
    side_bytes.* = std.math.maxInt(u64);
    const opened = Store.openBeside(
        std.mem.span(path),
        threads,
        flags & 1 != 0,
        flags & 2 == 0,
        std.mem.span(side_name),
        side[0..side_capacity],
    ) catch |err| return result(err);
    const found = opened orelse return status.ok;
    identity.* = found.store.identity() catch |err| {
        found.store.close();
        return result(err);
    };
    found.store.verify_indexed_reads = flags & 16 != 0;
    info.* = found.store.info();
    side_bytes.* = found.side_bytes;
    out.* = found.store;
    return status.ok;
}

export fn lx_store_close(store: *Store) void {
    store.close();
}

export fn lx_store_refresh(store: *Store) c_int {
    return result(store.refresh());
}

export fn lx_store_count(store: *Store) u64 {
    return store.count();
}

export fn lx_store_info_get(store: *Store, out: *store_module.Info) c_int {
    out.* = store.info();
    return status.ok;
}

/// Copies why open fell back to an older superblock or found it damaged
/// (empty when it did neither), as `lx_error_message` does.
export fn lx_store_fall_back_reason(store: *Store, target: [*]u8, capacity: usize) usize {
    return copyText(store.fallBackReason(), target, capacity);
}

export fn lx_store_append(
    store: *Store,
    source: ?[*]const u8,
    source_bytes: u64,
    offsets: ?[*]const u64,
    count: u64,
    codec: u32,
    first_out: *u64,
) c_int {
    status.clear();
    const record_codec = codecFrom(codec) catch |err| return result(err);
    first_out.* = store.append(
        slice(u8, source, source_bytes),
        slice(u64, offsets, count),
        record_codec,
    ) catch |err| return result(err);
    return status.ok;
}

export fn lx_store_gather(
    store: *Store,
    indices: ?[*]const u64,
    count: u64,
    target: ?[*]u8,
    target_bytes: u64,
    target_offsets: ?[*]const u64,
) c_int {
    const target_slice = sliceMut(u8, target, target_bytes);
    const offsets: ?[]const u64 = if (target_offsets) |pointer| pointer[0..count] else null;
    return result(store.gather(slice(u64, indices, count), target_slice, offsets));
}

/// The ragged gather (zig/ragged.zig): records packed from the start of
/// `target`, their row offsets (`count + 1`) in `offsets_out`, the bytes the
/// batch needs in `needed_bytes_out` (more than `target_bytes`: nothing read).
export fn lx_store_gather_rows(
    store: *Store,
    indices: ?[*]const u64,
    count: u64,
    row_bytes: u64,
    target: ?[*]u8,
    target_bytes: u64,
    offsets_out: [*]u64,
    needed_bytes_out: *u64,
) c_int {
    const target_slice = sliceMut(u8, target, target_bytes);
    needed_bytes_out.* = ragged.gatherStore(
        store,
        slice(u64, indices, count),
        row_bytes,
        target_slice,
        offsets_out[0 .. count + 1],
    ) catch |err| return result(err);
    return status.ok;
}

export fn lx_store_lengths(store: *Store, indices: ?[*]const u64, count: u64, out: ?[*]u64) c_int {
    const out_slice: []u64 = if (count == 0) &.{} else out.?[0..count];
    return result(store.lengths(slice(u64, indices, count), out_slice));
}

export fn lx_store_delete(
    store: *Store,
    indices: ?[*]const u64,
    count: u64,
    keep_order: u32,
) c_int {
    return result(store.delete(slice(u64, indices, count), keep_order != 0));
}

export fn lx_store_replace(
    store: *Store,
    indices: ?[*]const u64,
    count: u64,
    source: ?[*]const u8,
    source_bytes: u64,
    offsets: ?[*]const u64,
    codec: u32,
) c_int {
    status.clear();
    const record_codec = codecFrom(codec) catch |err| return result(err);
    return result(
        store.replace(
            slice(u64, indices, count),
            slice(u8, source, source_bytes),
            slice(u64, offsets, count),
            record_codec,
        ),
    );
}

export fn lx_store_compact(store: *Store) c_int {
    return result(store.compact());
}

export fn lx_store_sync(store: *Store) c_int {
    return result(store.sync());
}

export fn lx_store_train_dict(
    store: *Store,
    samples: ?[*]const u8,
    sizes: ?[*]const u64,
    count: u64,
    target_bytes: u64,
    dict_bytes_out: *u64,
) c_int {
    status.clear();
    const samples_bytes = blk: {
        var total: u64 = 0;
        for (slice(u64, sizes, count)) |size| total +|= size;
        break :blk total;
    };
    dict_bytes_out.* = store.trainDict(
        slice(u8, samples, samples_bytes),
        slice(u64, sizes, count),
        target_bytes,
    ) catch |err| return result(err);
    return status.ok;
}

/// Writes the damaged indices in [start, end) to `damaged_out`, which holds
/// at least end - start values, and their number to `damaged_count_out`.
export fn lx_store_verify(
    store: *Store,
    start: u64,
    end: u64,
    damaged_out: ?[*]u64,
    damaged_count_out: *u64,
) c_int {
    status.clear();
    damaged_count_out.* = 0;
    const capacity = if (end > start) end - start else 0;
    const out: []u64 = if (capacity == 0) &.{} else damaged_out.?[0..capacity];
    damaged_count_out.* = store.verify(start, end, out) catch |err| return result(err);
    return status.ok;
}

/// The stored bytes the `count` records packed in `source` would take with
/// `codec` (no dictionary codecs), on up to `threads` threads (0: all).
export fn lx_encoded_bytes(
    source: ?[*]const u8,
    source_bytes: u64,
    offsets: ?[*]const u64,
    count: u64,
    codec: u32,
    threads: u32,
    stored_bytes_out: *u64,
) c_int {
    status.clear();
    const record_codec = codecFrom(codec) catch |err| return result(err);
    const thread_count = if (threads == 0) workers.cpuCount() else threads;
    stored_bytes_out.* = encode.encodedBytes(
        thread_count,
        slice(u8, source, source_bytes),
        slice(u64, offsets, count),
        record_codec,
    ) catch |err| return result(err);
    return status.ok;
}

// ---- codecs ---------------------------------------------------------------

const shuffle = @import("shuffle.zig");
const codec_module = @import("codec.zig");

/// How many codecs format.Codec has: Python builds its codec table from
/// `lx_codec_get`, so the table has one definition.
export fn lx_codec_count() u32 {
    return @intCast(std.enums.values(format.Codec).len);
}

/// Codec `index` (0..lx_codec_count()): its name (NUL-terminated, cut to fit
/// as in lx_error_message), its id, the element bytes it shuffles by (1: not
/// shuffled) and whether it compresses with the store's dictionary.
export fn lx_codec_get(
    index: u32,
    name: [*]u8,
    capacity: usize,
    id_out: *u32,
    element_bytes_out: *u32,
    uses_dictionary_out: *u32,
) c_int {
    status.clear();
    const codecs = std.enums.values(format.Codec);
    if (index >= codecs.len) {
        return result(status.fail(
            error.InvalidArgument,
            "codec index {d} is past the {d} codecs",
            .{ index, codecs.len },
        ));
    }
    const codec = codecs[index];
    _ = copyText(@tagName(codec), name, capacity);
    id_out.* = @intFromEnum(codec);
    element_bytes_out.* = codec.elementBytes();
    uses_dictionary_out.* = @intFromBool(codec.usesDictionary());
    return status.ok;
}

/// Writes `bytes` of `source` byte-shuffled by `element_bytes` (2, 4 or 8)
/// into `target` (as many bytes, not overlapping `source`): a record as a
/// shuffled codec compresses it, for Python's dictionary samples.
export fn lx_codec_shuffle(
    source: ?[*]const u8,
    bytes: u64,
    element_bytes: u32,
    target: ?[*]u8,
) c_int {
    status.clear();
    if (!shuffle.supported(element_bytes)) {
        return result(status.fail(
            error.InvalidArgument,
            "the byte shuffle takes 2, 4 or 8-byte elements, not {d}",
            .{element_bytes},
        ));
    }
    shuffle.shuffle(element_bytes, slice(u8, source, bytes), sliceMut(u8, target, bytes));
    return status.ok;
}

/// A codec for one buffer (lx_codec_bound, lx_codec_encode, lx_codec_decode):
/// any codec but those that need a store's dictionary.
fn bufferCodecFrom(value: u32) status.Error!format.Codec {
    const buffer_codec = try codecFrom(value);
    if (buffer_codec.usesDictionary()) return status.fail(
        error.InvalidArgument,
        "{s} needs a store's dictionary: a buffer is encoded with a codec that needs none",
        .{@tagName(buffer_codec)},
    );
    return buffer_codec;
}

/// The most bytes lx_codec_encode writes for `source_bytes` with `codec`.
export fn lx_codec_bound(codec: u32, source_bytes: u64, bound_out: *u64) c_int {
    status.clear();
    const buffer_codec = bufferCodecFrom(codec) catch |err| return result(err);
    bound_out.* = codec_module.compressBound(buffer_codec, source_bytes);
    return status.ok;
}

/// `source_bytes` of `source` encoded with `codec` (no dictionary) as a
/// record of that codec is stored, into `target` (room for `capacity`
/// bytes, at least lx_codec_bound); the frame's length into `written_out`.
export fn lx_codec_encode(
    codec: u32,
    source: ?[*]const u8,
    source_bytes: u64,
    target: ?[*]u8,
    capacity: u64,
    written_out: *u64,
) c_int {
    status.clear();
    const buffer_codec = bufferCodecFrom(codec) catch |err| return result(err);
    const bound = codec_module.compressBound(buffer_codec, source_bytes);
    if (capacity < bound) return result(status.fail(
        error.BufferTooSmall,
        "room for {d} bytes; encoding {d} bytes with {s} needs {d}",
        .{ capacity, source_bytes, @tagName(buffer_codec), bound },
    ));
    written_out.* = codec_module.encodeBuffer(
        buffer_codec,
        slice(u8, source, source_bytes),
        sliceMut(u8, target, capacity),
    ) catch |err| return result(err);
    return status.ok;
}

/// The frame `payload` (lx_codec_encode's, with `codec`) decoded into
/// exactly `target_bytes` of `target`: LX corrupt if it is not one.
export fn lx_codec_decode(
    codec: u32,
    payload: ?[*]const u8,
    payload_bytes: u64,
    target: ?[*]u8,
    target_bytes: u64,
) c_int {
    status.clear();
    const buffer_codec = bufferCodecFrom(codec) catch |err| return result(err);
    codec_module.decodeBuffer(
        buffer_codec,
        slice(u8, payload, payload_bytes),
        sliceMut(u8, target, target_bytes),
    ) catch |err| return result(err);
    return status.ok;
}

// ---- writable_batch_mode ----------------------------------------------------

const changes = @import("changes.zig");

/// The rows of `edited` that differ from `original` among those overlapping
/// `pages` (see changes.checkedChangedRows), into `rows_out`, their count
/// into `count_out`.
export fn lx_changed_rows(
    edited: ?[*]const u8,
    original: ?[*]const u8,
    rows: u64,
    row_bytes: u64,
    pages: ?[*]const u64,
    page_count: u64,
    page_bytes: u64,
    rows_out: ?[*]u64,
    capacity: u64,
    count_out: *u64,
) c_int {
    status.clear();
    count_out.* = 0;
    const bytes = std.math.mul(u64, rows, row_bytes) catch return result(status.fail(
        error.InvalidArgument,
        "{d} rows of {d} bytes overflow 64 bits",
        .{ rows, row_bytes },
    ));
    count_out.* = changes.checkedChangedRows(
        slice(u8, edited, bytes),
        slice(u8, original, bytes),
        row_bytes,
        slice(u64, pages, page_count),
        page_bytes,
        sliceMut(u64, rows_out, capacity),
    ) catch |err| return result(err);
    return status.ok;
}

/// `lx_changed_rows` against the committed records of a fixed store
/// (Store.changedRows): `edited` holds records 0.. of it.
export fn lx_store_changed_rows(
    store: *Store,
    edited: ?[*]const u8,
    edited_bytes: u64,
    pages: ?[*]const u64,
    page_count: u64,
    page_bytes: u64,
    rows_out: ?[*]u64,
    capacity: u64,
    count_out: *u64,
) c_int {
    count_out.* = 0;
    count_out.* = store.changedRows(
        slice(u8, edited, edited_bytes),
        slice(u64, pages, page_count),
        page_bytes,
        sliceMut(u64, rows_out, capacity),
    ) catch |err| return result(err);
    return status.ok;
}

// ---- zsampler ------------------------------------------------------------

const sampler = @import("sampler.zig");

/// The size of `lx_sampler_config`, for Python's layout check at import.
export fn lx_sampler_config_bytes() u64 {
    return @sizeOf(sampler.Config);
}

/// Writes this rank's `config.batch_size` indices of batch `step` into
/// `target`, which holds `target_count` slots. Validates the config on every
/// call: it costs a few compares against a batch of hashing.
export fn lx_sampler_batch(
    config: *const sampler.Config,
    step: u64,
    target: [*]u64,
    target_count: u64,
) c_int {
    sampler.validate(config) catch |err| return result(err);
    if (target_count < config.batch_size) {
        return result(status.fail(error.BufferTooSmall, "sampler target holds {d} indices " ++
            "but batch_size is {d}: pass a uint64 buffer of batch_size", .{
            target_count,
            config.batch_size,
        }));
    }
    if (config.mode == @intFromEnum(sampler.Mode.block)) {
        return result(status.fail(error.InvalidArgument, "sampler mode 3 (BLOCK) needs its " ++
            "groups: call lx_sampler_block_batch", .{}));
    }
    sampler.batch(config, step, target[0..config.batch_size]);
    return status.ok;
}

/// The size of `lx_sampler_blocks`, for Python's layout check at import.
export fn lx_sampler_blocks_bytes() u64 {
    return @sizeOf(sampler.Blocks);
}

/// `lx_sampler_batch` for mode 3 (BLOCK), whose batches also depend on the
/// groups in `blocks`; validates both on every call (O(groups), as is the
/// batch itself).
export fn lx_sampler_block_batch(
    config: *const sampler.Config,
    blocks: *const sampler.Blocks,
    step: u64,
    target: [*]u64,
    target_count: u64,
) c_int {
    sampler.validateBlocks(config, blocks) catch |err| return result(err);
    if (target_count < config.batch_size) {
        return result(status.fail(error.BufferTooSmall, "sampler target holds {d} indices " ++
            "but batch_size is {d}: pass a uint64 buffer of batch_size", .{
            target_count,
            config.batch_size,
        }));
    }
    sampler.batchBlock(config, blocks, step, target[0..config.batch_size]);
    return status.ok;
}

/// BLOCK: the indices at positions offset..offset + count of cycle `cycle`'s
/// stream into `target` (the elastic anchor's runs of a cycle).
export fn lx_sampler_block_positions(
    config: *const sampler.Config,
    blocks: *const sampler.Blocks,
    cycle: u64,
    offset: u64,
    target: [*]u64,
    count: u64,
) c_int {
    sampler.validateBlocks(config, blocks) catch |err| return result(err);
    if (offset > config.length or count > config.length - offset) {
        return result(status.fail(error.InvalidArgument, "BLOCK positions {d}..{d}+{d} run " ++
            "past the cycle's length {d}: read inside one cycle", .{
            offset,
            offset,
            count,
            config.length,
        }));
    }
    sampler.positionsBlock(config, blocks, cycle, offset, target[0..count]);
    return status.ok;
}

test {
    _ = sampler;
}

test {
    std.testing.refAllDecls(@This());
    _ = status;
    _ = format;
    _ = store_module;
    _ = @import("codec.zig");
    _ = @import("workers.zig");
    _ = @import("plans.zig");
    _ = changes;
    _ = @import("commit.zig");
    _ = @import("testing/simulation.zig");
}

// ---- sharded datasets ------------------------------------------------------

const shards_module = @import("shards.zig");
const Shards = shards_module.Shards;

/// A read handle over `shard_count` open stores, shard s holding global rows
/// `row_starts[s]..row_starts[s + 1]`. It borrows the stores: close it first.
export fn lx_shards_open(
    stores: [*]const *Store,
    row_starts: [*]const u64,
    shard_count: u64,
    threads: u32,
    out: *?*Shards,
) c_int {
    out.* = null;
    // Shards.create checks the count first (shard_count_max): the slices
    // are only bounds, not reads.
    const shard_stores = stores[0..shard_count];
    out.* = Shards.create(shard_stores, row_starts[0..shard_count +| 1], threads) catch |err| {
        return result(err);
    };
    return status.ok;
}

/// The most shards one handle reads (shards.zig), for Python's checks.
export fn lx_shard_count_max() u64 {
    return shards_module.shard_count_max;
}

export fn lx_shards_close(shards: *Shards) void {
    shards.destroy();
}

export fn lx_shards_gather(
    shards: *Shards,
    indices: ?[*]const u64,
    count: u64,
    target: ?[*]u8,
    target_bytes: u64,
    target_offsets: ?[*]const u64,
    record_bytes: u64,
) c_int {
    const target_slice = sliceMut(u8, target, target_bytes);
    const offsets: ?[]const u64 = if (target_offsets) |pointer| pointer[0..count] else null;
    return result(shards.gather(slice(u64, indices, count), target_slice, offsets, record_bytes));
}

/// `lx_store_gather_rows` over the shards.
export fn lx_shards_gather_rows(
    shards: *Shards,
    indices: ?[*]const u64,
    count: u64,
    row_bytes: u64,
    target: ?[*]u8,
    target_bytes: u64,
    offsets_out: [*]u64,
    needed_bytes_out: *u64,
) c_int {
    const target_slice = sliceMut(u8, target, target_bytes);
    needed_bytes_out.* = shards.gatherRows(
        slice(u64, indices, count),
        row_bytes,
        target_slice,
        offsets_out[0 .. count + 1],
    ) catch |err| return result(err);
    return status.ok;
}

export fn lx_shards_lengths(
    shards: *Shards,
    indices: ?[*]const u64,
    count: u64,
    out: ?[*]u64,
) c_int {
    const out_slice: []u64 = if (count == 0) &.{} else out.?[0..count];
    return result(shards.lengths(slice(u64, indices, count), out_slice));
}

test {
    _ = shards_module;
    _ = ragged;
}
