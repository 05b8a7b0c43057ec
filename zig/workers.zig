//! The process-wide worker pool that batch calls fan out on, and the first
//! failure among a batch's tasks.
//!
//! Invariant: a call with `threads = t` runs its work on at most `t` threads
//! at once (the calling thread counts as one), whatever the pool's size.
const std = @import("std");
const status = @import("status.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;

var pool: std.Thread.Pool = undefined;
var pool_state = std.atomic.Value(u8).init(0); // 0 none, 1 ready, 2 failed
var pool_mutex: std.Thread.Mutex = .{};

/// The process-wide pool (one thread per core), started on first use and
/// kept for the life of the process. Null if threads cannot be started; the
/// caller then does the work itself.
fn workers() ?*std.Thread.Pool {
    if (pool_state.load(.acquire) == 1) return &pool;
    pool_mutex.lock();
    defer pool_mutex.unlock();
    if (pool_state.load(.acquire) == 0) {
        const options: std.Thread.Pool.Options = .{ .allocator = allocator, .n_jobs = cpuCount() };
        const ok = if (pool.init(options)) true else |_| false;
        pool_state.store(if (ok) 1 else 2, .release);
    }
    return if (pool_state.load(.acquire) == 1) &pool else null;
}

/// The CPUs this process may run on, counted once (one sched_getaffinity):
/// the pool's size, and every open's default thread cap.
pub fn cpuCount() u32 {
    const known = cpu_count.load(.monotonic);
    if (known != 0) return known;
    const counted: u32 = @intCast(@max(1, @min(std.Thread.getCpuCount() catch 1, 1024)));
    cpu_count.store(counted, .monotonic);
    return counted;
}

var cpu_count = std.atomic.Value(u32).init(0);

/// Below this a thread handoff costs more than it saves.
const inline_bytes = 256 * 1024;
/// Ranges per thread: records differ in cost, so each thread takes several
/// smaller ranges from a shared cursor rather than one fixed share.
const ranges_per_thread = 4;

/// Runs `work(context, start, end)` over [0, count) in contiguous ranges, on
/// at most `threads` threads: the caller and `threads - 1` pool tasks, each
/// taking the next range from a shared cursor until none is left.
pub fn parallelFor(
    count: u64,
    total_bytes: u64,
    threads: u32,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    if (count == 0) return;
    const thread_count: u64 = @min(count, threads);
    const range = std.math.divCeil(u64, count, thread_count * ranges_per_thread) catch unreachable;
    parallelForRanges(count, total_bytes, threads, range, context, work);
}

/// As `parallelFor`, one index at a time: for indices that are each a
/// large task (the pieces of a compressed write), so the threads finish
/// within one task of each other instead of one eighth of the work.
pub fn parallelForEach(
    count: u64,
    total_bytes: u64,
    threads: u32,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    parallelForRanges(count, total_bytes, threads, 1, context, work);
}

fn parallelForRanges(
    count: u64,
    total_bytes: u64,
    threads: u32,
    range: u64,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    assert(threads >= 1);
    if (count == 0) return;
    assert(range >= 1);
    const parallel = threads > 1 and total_bytes >= inline_bytes and count > 1;
    const runner = if (parallel) workers() else null;
    const pool_pointer = runner orelse return work(context, 0, count);
    const thread_count: u64 = @min(count, threads);
    const Shared = struct {
        context: @TypeOf(context),
        count: u64,
        range: u64,
        cursor: std.atomic.Value(u64) = .init(0),

        fn drain(shared: *@This()) void {
            while (true) {
                const start = shared.cursor.fetchAdd(shared.range, .monotonic);
                if (start >= shared.count) return;
                work(shared.context, start, @min(shared.count, start + shared.range));
            }
        }
    };
    var shared = Shared{ .context = context, .count = count, .range = range };
    var wait_group: std.Thread.WaitGroup = .{};
    for (1..thread_count) |_| pool_pointer.spawnWg(&wait_group, Shared.drain, .{&shared});
    shared.drain();
    // Run queued pool tasks while waiting: a caller that is itself a pool
    // thread (a gather across shards) must not block the tasks it waits for.
    pool_pointer.waitAndWork(&wait_group);
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

    /// Returns the recorded failure as an error with its message, if any.
    pub fn check(failure: *Failure, comptime what: []const u8) Error!void {
        if (failure.err) |err| {
            return status.fail(
                err,
                what ++ " record {d}: {s}",
                .{ failure.record, failure.reason },
            );
        }
    }
};

test "parallelFor and parallelForEach cover every index exactly once" {
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
    parallelForEach(hits.len, 1 << 30, 4, &counter, Counter.run);
    for (hits) |hit| try std.testing.expectEqual(@as(u32, 2), hit.load(.monotonic));
    // No work is no call (an empty batch's gather).
    parallelFor(0, 1 << 30, 4, &counter, Counter.run);
    parallelForEach(0, 1 << 30, 4, &counter, Counter.run);
    for (hits) |hit| try std.testing.expectEqual(@as(u32, 2), hit.load(.monotonic));
}

test "parallelFor runs on at most `threads` threads at once" {
    const Probe = struct {
        running: std.atomic.Value(u32) = .init(0),
        peak: std.atomic.Value(u32) = .init(0),
        fn run(self: *@This(), start: u64, end: u64) void {
            _ = start;
            _ = end;
            const now = self.running.fetchAdd(1, .seq_cst) + 1;
            _ = self.peak.fetchMax(now, .seq_cst);
            std.Thread.sleep(200 * std.time.ns_per_us);
            _ = self.running.fetchSub(1, .seq_cst);
        }
    };
    for ([_]u32{ 1, 2, 3 }) |threads| {
        var probe = Probe{};
        parallelFor(64, 1 << 30, threads, &probe, Probe.run);
        try std.testing.expect(probe.peak.load(.seq_cst) <= threads);
        try std.testing.expect(probe.peak.load(.seq_cst) >= 1);
    }
}
