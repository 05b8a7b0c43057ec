//! Record encoding and decoding: raw copies and zstd frames, with pooled zstd
//! contexts so no context is created on the per-record hot path, and the
//! process-wide worker pool that batch calls fan out on.
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

// ---- the worker pool ------------------------------------------------------

var pool: std.Thread.Pool = undefined;
var pool_state = std.atomic.Value(u8).init(0); // 0 none, 1 ready, 2 failed
var pool_mutex: std.Thread.Mutex = .{};

/// The process-wide pool (one thread per core), started on first use and
/// kept for the life of the process. Null if threads cannot be started; the
/// caller then does the work itself.
pub fn workers() ?*std.Thread.Pool {
    if (pool_state.load(.acquire) == 1) return &pool;
    pool_mutex.lock();
    defer pool_mutex.unlock();
    if (pool_state.load(.acquire) == 0) {
        const ok = if (pool.init(.{ .allocator = allocator })) true else |_| false;
        pool_state.store(if (ok) 1 else 2, .release);
    }
    return if (pool_state.load(.acquire) == 1) &pool else null;
}

pub fn cpuCount() u32 {
    return @intCast(@max(1, @min(std.Thread.getCpuCount() catch 1, 1024)));
}

/// Runs `work(context, start, end)` over [0, count) split into contiguous
/// ranges, on up to `threads` workers (the caller works too). Small jobs run
/// inline: below `inline_bytes` a thread handoff costs more than it saves.
pub fn parallelFor(
    count: u64,
    total_bytes: u64,
    threads: u32,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    const inline_bytes = 256 * 1024;
    const tasks_per_thread = 4;
    if (count == 0) return;
    const pool_pointer = if (threads > 1 and total_bytes >= inline_bytes and count > 1) workers() else null;
    const runner = pool_pointer orelse return work(context, 0, count);
    const task_count: u64 = @min(count, @as(u64, threads) * tasks_per_thread);
    var wait_group: std.Thread.WaitGroup = .{};
    var start: u64 = 0;
    for (0..task_count) |task| {
        const end = count * (task + 1) / task_count;
        if (end > start) runner.spawnWg(&wait_group, work, .{ context, start, end });
        start = end;
    }
    std.debug.assert(start == count);
    runner.waitAndWork(&wait_group);
}

/// The first failure among a batch's tasks, reported on the calling thread.
pub const Failure = struct {
    mutex: std.Thread.Mutex = .{},
    err: ?Error = null,
    record: u64 = 0,
    reason: []const u8 = "",

    pub fn set(failure: *Failure, err: Error, record: u64, reason: []const u8) void {
        failure.mutex.lock();
        defer failure.mutex.unlock();
        if (failure.err == null or record < failure.record) {
            failure.err = err;
            failure.record = record;
            failure.reason = reason;
        }
    }

    pub fn failed(failure: *Failure) bool {
        failure.mutex.lock();
        defer failure.mutex.unlock();
        return failure.err != null;
    }

    /// Returns the recorded failure as an error with its message, if any.
    pub fn check(failure: *Failure, comptime what: []const u8) Error!void {
        if (failure.err) |err| {
            return status.fail(err, what ++ " record {d}: {s}", .{ failure.record, failure.reason });
        }
    }
};

test "parallelFor covers every index exactly once" {
    const Counter = struct {
        hits: []std.atomic.Value(u32),
        fn run(self: *const @This(), start: u64, end: u64) void {
            for (start..end) |index| _ = self.hits[index].fetchAdd(1, .monotonic);
        }
    };
    var hits: [1000]std.atomic.Value(u32) = undefined;
    for (&hits) |*hit| hit.* = .init(0);
    const counter = Counter{ .hits = &hits };
    parallelFor(hits.len, 1 << 30, 4, &counter, Counter.run);
    for (hits) |hit| try std.testing.expectEqual(@as(u32, 1), hit.load(.monotonic));
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
