//! The process-wide worker pool that batch calls fan out on, and the first
//! failure among a batch's tasks.
//!
//! Invariant: a call with `threads = t` runs its work on at most `t` threads
//! at once (the calling thread counts as one), whatever the pool's size.
const std = @import("std");
const io = @import("io.zig");
const status = @import("status.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;

var pool: Pool = .{};
var pool_state = std.atomic.Value(u8).init(0); // 0 none, 1 ready, 2 failed
var pool_mutex: std.Thread.Mutex = .{};

/// The process-wide pool (one thread per core), started on first use and
/// kept for the life of the process. Null if threads cannot be started; the
/// caller then does the work itself.
fn workers() ?*Pool {
    if (pool_state.load(.acquire) == 1) return &pool;
    pool_mutex.lock();
    defer pool_mutex.unlock();
    if (pool_state.load(.acquire) == 0) {
        var started: u32 = 0;
        for (0..cpuCount()) |_| {
            const thread = std.Thread.spawn(.{}, Pool.worker, .{&pool}) catch break;
            thread.detach();
            started += 1;
        }
        pool.threads = started;
        pool_state.store(if (started > 0) 1 else 2, .release);
    }
    return if (pool_state.load(.acquire) == 1) &pool else null;
}

/// How long an idle thread spins before it sleeps: a pool thread after its
/// last task, for the next one (a loop of gathers calls again within tens
/// of microseconds; with a futex wake-up per call the memory ceiling of a
/// 3 MiB gather drops to about 0.8x, scripts/gather_gap.py), and a caller
/// for its tasks to finish. Bounded, so an idle process does not burn its
/// cores.
const spin_ns = 50 * std.time.ns_per_us;

fn instant() ?std.time.Instant {
    return std.time.Instant.now() catch null;
}

/// Spins while `value` holds `seen`, until `since` + `spin_ns`; returns
/// whether it changed. No clock, no spin.
fn spinWhile(value: *const std.atomic.Value(u32), seen: u32, since: ?std.time.Instant) bool {
    const start = since orelse return value.load(.acquire) != seen;
    while (true) {
        for (0..64) |_| {
            if (value.load(.acquire) != seen) return true;
            std.atomic.spinLoopHint();
        }
        const current = instant() orelse return false;
        if (current.since(start) >= spin_ns) return value.load(.acquire) != seen;
    }
}

/// Whether another thread wants this thread's core: on a loaded machine a
/// spinning pool thread takes the core from the work (the caller's, or a
/// helper's that then holds the caller up), so a thread that was preempted
/// since its last idle spell does not spin for `quiet_ns` after.
const Contention = struct {
    switches: ?isize = null,
    until: ?std.time.Instant = null,

    const quiet_ns = 10 * std.time.ns_per_ms;

    fn loaded(contention: *Contention, at: ?std.time.Instant) bool {
        const switches = io.preemptions() orelse return false;
        const current = at orelse return true;
        defer contention.switches = switches;
        if (contention.switches != null and switches != contention.switches.?) {
            contention.until = current;
            return true;
        }
        const since = contention.until orelse return false;
        if (current.since(since) < quiet_ns) return true;
        contention.until = null;
        return false;
    }
};

/// Work queued on the pool, `copies` times: each copy is one helper of a
/// call. It lives in its caller's frame, which waits (`Batch.wait`) until
/// every copy has run.
const Task = struct {
    run: *const fn (*Task) void,
    copies: u32,
    next: ?*Task = null,
};

/// A queue of tasks and the threads that run them. An idle thread spins on
/// `epoch` (bumped after every push) for `spin_ns`, then sleeps on it; a
/// push wakes sleepers only for the copies the spinning threads will not
/// take. Liveness never rests on a wake-up: a caller runs the copies still
/// queued itself before it waits.
const Pool = struct {
    mutex: std.Thread.Mutex = .{},
    head: ?*Task = null,
    threads: u32 = 0,
    epoch: std.atomic.Value(u32) align(std.atomic.cache_line) = .init(0),
    spinning: std.atomic.Value(u32) = .init(0),
    sleeping: std.atomic.Value(u32) = .init(0),

    fn push(queue: *Pool, task: *Task) void {
        assert(task.copies > 0);
        queue.mutex.lock();
        task.next = queue.head;
        queue.head = task;
        queue.mutex.unlock();
        // seq_cst with the idle side's counts and its re-check of `epoch`
        // (`worker`): either this sees a thread that is about to sleep
        // counted, or that thread sees this bump and does not sleep.
        _ = queue.epoch.fetchAdd(1, .seq_cst);
        const spinning = queue.spinning.load(.seq_cst);
        if (spinning >= task.copies or queue.sleeping.load(.seq_cst) == 0) return;
        std.Thread.Futex.wake(&queue.epoch, task.copies - spinning);
    }

    fn pop(queue: *Pool) ?*Task {
        queue.mutex.lock();
        defer queue.mutex.unlock();
        const task = queue.head orelse return null;
        task.copies -= 1;
        if (task.copies == 0) queue.head = task.next;
        return task;
    }

    fn worker(queue: *Pool) void {
        // An idle spell spins from its start (null: not at all), so a
        // thread woken for a copy another thread took sleeps again at once.
        var idle = false;
        var spin_since: ?std.time.Instant = null;
        var contention: Contention = .{};
        while (true) {
            const seen = queue.epoch.load(.seq_cst);
            if (queue.pop()) |task| {
                task.run(task);
                idle = false;
                continue;
            }
            if (!idle) {
                idle = true;
                const start = instant();
                spin_since = if (contention.loaded(start)) null else start;
            }
            if (spin_since != null) _ = queue.spinning.fetchAdd(1, .seq_cst);
            const changed = spinWhile(&queue.epoch, seen, spin_since);
            if (spin_since != null) _ = queue.spinning.fetchSub(1, .seq_cst);
            if (changed) continue;
            _ = queue.sleeping.fetchAdd(1, .seq_cst);
            if (queue.epoch.load(.seq_cst) == seen) std.Thread.Futex.wait(&queue.epoch, seen);
            _ = queue.sleeping.fetchSub(1, .seq_cst);
        }
    }
};

/// The copies of one call's task not finished yet, in steps of 2; the low
/// bit says the caller sleeps on it.
const Batch = struct {
    pending: std.atomic.Value(u32),

    fn init(copies: u32) Batch {
        return .{ .pending = .init(2 * copies) };
    }

    fn finish(batch: *Batch) void {
        // The old value says whether the caller sleeps, so nothing of
        // `batch` is read once the caller may have returned (a wake on a
        // stale address is harmless).
        if (batch.pending.fetchSub(2, .release) == 3) std.Thread.Futex.wake(&batch.pending, 1);
    }

    /// Runs what is still queued (its own copies first in line, or a
    /// nested call's: a pool thread waiting here must not hold up the
    /// tasks it waits for), then spins, then sleeps until all are done.
    fn wait(batch: *Batch, queue: *Pool) void {
        while (batch.pending.load(.acquire) != 0) {
            const task = queue.pop() orelse break;
            task.run(task);
        }
        const since = instant();
        while (true) {
            const seen = batch.pending.load(.acquire);
            if (seen == 0) return;
            if (!spinWhile(&batch.pending, seen, since)) break;
        }
        _ = batch.pending.fetchOr(1, .acquire);
        while (true) {
            const state = batch.pending.load(.acquire);
            if (state == 1) return;
            std.Thread.Futex.wait(&batch.pending, state);
        }
    }
};

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
/// Each claim of a call takes this share of the indices still unclaimed,
/// per thread (guided scheduling): large ranges first, single indices at
/// the end, so the threads finish within one index of each other. Fixed
/// ranges (a quarter of a thread's share) could leave one thread idle for
/// up to a range at the end of every call (32 records of a 256-record
/// gather on 2 threads).
const claim_divisor_per_thread = 2;

/// Runs `work(context, start, end)` over [0, count) in contiguous ranges, on
/// at most `threads` threads: the caller and `threads - 1` pool tasks, each
/// claiming the next range from a shared cursor until none is left.
pub fn parallelFor(
    count: u64,
    total_bytes: u64,
    threads: u32,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    if (count == 0) return;
    const thread_count: u64 = @min(count, threads);
    const divisor = thread_count * claim_divisor_per_thread;
    parallelForRanges(count, total_bytes, threads, divisor, context, work);
}

/// As `parallelFor`, one index at a time: for indices that are each a
/// large task (the pieces of a compressed write), so no thread claims two
/// while another has none.
pub fn parallelForEach(
    count: u64,
    total_bytes: u64,
    threads: u32,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    parallelForRanges(count, total_bytes, threads, count, context, work);
}

/// The next range of [0, count) after `cursor`: a `divisor`-th of what is
/// left, at least one index; null once all is claimed.
fn claim(cursor: *std.atomic.Value(u64), count: u64, divisor: u64) ?[2]u64 {
    var start = cursor.load(.monotonic);
    while (start < count) {
        const end = start + @max(1, (count - start) / divisor);
        start = cursor.cmpxchgWeak(start, end, .monotonic, .monotonic) orelse
            return .{ start, end };
    }
    return null;
}

fn parallelForRanges(
    count: u64,
    total_bytes: u64,
    threads: u32,
    divisor: u64,
    context: anytype,
    comptime work: fn (@TypeOf(context), u64, u64) void,
) void {
    assert(threads >= 1);
    if (count == 0) return;
    assert(divisor >= 1);
    const parallel = threads > 1 and total_bytes >= inline_bytes and count > 1;
    const runner = if (parallel) workers() else null;
    const pool_pointer = runner orelse return work(context, 0, count);
    const thread_count: u64 = @min(count, threads);
    const Shared = struct {
        context: @TypeOf(context),
        count: u64,
        divisor: u64,
        cursor: std.atomic.Value(u64) = .init(0),
        task: Task,
        batch: Batch,

        fn drain(shared: *@This()) void {
            while (claim(&shared.cursor, shared.count, shared.divisor)) |range| {
                work(shared.context, range[0], range[1]);
            }
        }

        fn help(task: *Task) void {
            const shared: *@This() = @fieldParentPtr("task", task);
            shared.drain();
            shared.batch.finish();
        }
    };
    // More helpers than pool threads could not run at once anyway.
    const helpers: u32 = @intCast(@min(thread_count - 1, pool_pointer.threads));
    var shared = Shared{
        .context = context,
        .count = count,
        .divisor = divisor,
        .task = .{ .run = Shared.help, .copies = helpers },
        .batch = .init(helpers),
    };
    if (helpers > 0) pool_pointer.push(&shared.task);
    shared.drain();
    shared.batch.wait(pool_pointer);
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

test "claims shrink to single indices at the end, in few steps" {
    // A gather of 256 records on 2 threads: fixed ranges of 32 left one
    // thread idle for up to 32 records' decode at the end of every call.
    for ([_]u64{ 1, 2, 7, 256, 10_000 }) |count| {
        for ([_]u64{ 4, count }) |divisor| {
            var cursor = std.atomic.Value(u64).init(0);
            var next: u64 = 0;
            var last_size: u64 = std.math.maxInt(u64);
            var claims: u64 = 0;
            while (claim(&cursor, count, divisor)) |range| : (claims += 1) {
                try std.testing.expectEqual(next, range[0]);
                const size = range[1] - range[0];
                try std.testing.expect(size >= 1 and size <= last_size);
                try std.testing.expect(size <= @max(1, (count - range[0]) / divisor));
                next, last_size = .{ range[1], size };
            }
            try std.testing.expectEqual(count, next);
            try std.testing.expectEqual(@as(u64, 1), last_size);
            // About divisor * ln(count / divisor) claims, plus the single
            // indices of the tail: far fewer than one per index.
            if (divisor == 4 and count >= 256) try std.testing.expect(claims * 4 < count);
        }
    }
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

test "a call wakes the pool threads whether they spin or sleep" {
    // Each range waits (up to a few seconds) for the other range to start:
    // it passes only if a pool thread took one while the caller held the
    // other, i.e. the call reached a thread that was spinning (back to
    // back calls) or asleep (after a pause longer than the spin).
    const Meet = struct {
        arrived: std.atomic.Value(u32) = .init(0),
        met: std.atomic.Value(u32) = .init(0),
        fn run(self: *@This(), start: u64, end: u64) void {
            _ = start;
            _ = end;
            const target = (self.arrived.fetchAdd(1, .seq_cst) / 2 + 1) * 2;
            var waited: u64 = 0;
            while (self.arrived.load(.seq_cst) < target) : (waited += 1) {
                if (waited == 20_000) return; // 20,000 × 100 µs: no helper came
                std.Thread.sleep(100 * std.time.ns_per_us);
            }
            _ = self.met.fetchAdd(1, .seq_cst);
        }
    };
    var meet = Meet{};
    for (0..40) |call| {
        // Every fourth call after the pool threads fell asleep.
        if (call % 4 == 0) std.Thread.sleep(5 * std.time.ns_per_ms);
        parallelFor(2, 1 << 30, 2, &meet, Meet.run);
    }
    try std.testing.expectEqual(@as(u32, 80), meet.arrived.load(.seq_cst));
    try std.testing.expectEqual(@as(u32, 80), meet.met.load(.seq_cst));
}

test "nested calls from pool threads finish" {
    // A pool thread's task that makes a call of its own (a gather across
    // shards) while every pool thread may be busy the same way.
    const Inner = struct {
        hits: std.atomic.Value(u64) = .init(0),
        fn run(self: *@This(), start: u64, end: u64) void {
            _ = self.hits.fetchAdd(end - start, .monotonic);
        }
    };
    const Outer = struct {
        inner: *Inner,
        fn run(self: *const @This(), start: u64, end: u64) void {
            for (start..end) |_| parallelFor(100, 1 << 30, 4, self.inner, Inner.run);
        }
    };
    var inner = Inner{};
    const outer = Outer{ .inner = &inner };
    for (0..20) |_| parallelFor(16, 1 << 30, 4, &outer, Outer.run);
    try std.testing.expectEqual(@as(u64, 20 * 16 * 100), inner.hits.load(.monotonic));
}
