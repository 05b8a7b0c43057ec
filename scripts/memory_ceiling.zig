//! The memory ceiling of `scripts/bench.py store`: a native gather of the
//! bench's random rows with plain memcpy on 1, 2, ... threads. No Python
//! call per batch, no index check, no hand-off between batches: no store can
//! gather these records from memory faster on that many threads.
//!
//! Built as a shared library (scripts/bench_ceilings.py compiles it with
//! `python -m ziglang build-lib -dynamic` and calls it through ctypes), so a
//! ceiling pass runs in the bench's process between its gathers, from the
//! same source into the same destination array.
const std = @import("std");

const Copy = *const fn (noalias ?*anyopaque, noalias ?*const anyopaque, usize) callconv(.c) ?*anyopaque;

/// Zig's @memcpy: the compiler_rt copy the loaderx library is built with.
fn zigCopy(noalias target: ?*anyopaque, noalias source: ?*const anyopaque, bytes: usize) callconv(.c) ?*anyopaque {
    const to: [*]u8 = @ptrCast(target.?);
    const from: [*]const u8 = @ptrCast(source.?);
    @memcpy(to[0..bytes], from[0..bytes]);
    return target;
}

var libc_memcpy: ?Copy = null;

/// The C library's own memcpy, looked up in libc.so.6 (a plain `memcpy`
/// call from Zig binds to compiler_rt's); null when it cannot be found.
fn libcCopy() ?Copy {
    if (libc_memcpy) |copy| return copy;
    const libc = std.c.dlopen("libc.so.6", .{ .NOW = true }) orelse return null;
    const symbol = std.c.dlsym(libc, "memcpy") orelse return null;
    libc_memcpy = @ptrCast(@alignCast(symbol));
    return libc_memcpy;
}

const Gather = struct {
    source: [*]const u8,
    record_bytes: usize,
    indices: []const u64,
    batch: usize,
    target: [*]u8,
    copy: Copy,
    ready: std.atomic.Value(usize) = .init(0),
    go: std.atomic.Value(bool) = .init(false),

    /// Copies rows [first, last) of every batch into their places in the
    /// one batch-sized target.
    fn share(gather: *Gather, first: usize, last: usize) void {
        _ = gather.ready.fetchAdd(1, .release);
        while (!gather.go.load(.acquire)) std.atomic.spinLoopHint();
        const bytes = gather.record_bytes;
        var start: usize = 0;
        while (start < gather.indices.len) : (start += gather.batch) {
            for (first..last) |k| {
                const index = gather.indices[start + k];
                _ = gather.copy(gather.target + k * bytes, gather.source + index * bytes, bytes);
            }
        }
    }
};

/// Gathers `count` records (`count / batch` batches of `batch`) of
/// `record_bytes` from `source` at `indices` into `target` (one batch long)
/// on `threads` threads, each with a fixed share of every batch; `copy` 0 is
/// the C library's memcpy, 1 Zig's @memcpy. Returns the nanoseconds from
/// the start signal, given once every thread runs, to the last thread's end,
/// or 0 if a thread cannot be started, memcpy is not found, or the
/// arguments make no whole batches. The caller checks the indices.
export fn memory_gather(
    source: [*]const u8,
    record_bytes: usize,
    indices: [*]const u64,
    count: usize,
    batch: usize,
    target: [*]u8,
    threads: usize,
    copy: u32,
) u64 {
    if (batch == 0 or count % batch != 0 or threads == 0 or threads > 1024) return 0;
    const chosen: Copy = if (copy == 1) &zigCopy else libcCopy() orelse return 0;
    var gather = Gather{
        .source = source,
        .record_bytes = record_bytes,
        .indices = indices[0..count],
        .batch = batch,
        .target = target,
        .copy = chosen,
    };
    var spawned: [1024]std.Thread = undefined;
    var started: usize = 1;
    defer {
        gather.go.store(true, .release);
        for (spawned[1..started]) |thread| thread.join();
    }
    // Thread j copies rows [j * batch / threads, (j + 1) * batch / threads).
    while (started < threads) : (started += 1) {
        const j = started;
        spawned[j] = std.Thread.spawn(.{}, Gather.share, .{
            &gather, j * batch / threads, (j + 1) * batch / threads,
        }) catch return 0;
    }
    // Timed from when every thread is running: a start, not a copy, is
    // what a new thread waits for.
    while (gather.ready.load(.acquire) < threads - 1) std.atomic.spinLoopHint();
    var timer = std.time.Timer.start() catch return 0;
    gather.go.store(true, .release);
    gather.share(0, batch / threads);
    for (spawned[1..threads]) |thread| thread.join();
    started = 1; // joined
    return timer.read();
}

/// The same gather with a hand-off per batch, as a gather call makes one:
/// the threads stay up for the whole call, but each batch is published to
/// them and waited for, the workers and the caller sleeping on a futex
/// between batches (`spin` 0) or spinning (`spin` 1). What this loses
/// against `memory_gather` is what a per-batch fork-join costs here.
const Synced = struct {
    gather: Gather,
    threads: usize,
    spin: bool,
    generation: std.atomic.Value(u32) = .init(0),
    done: std.atomic.Value(u32) = .init(0),

    const stop = std.math.maxInt(u32);

    fn rows(synced: *Synced, j: usize, batch_number: usize) void {
        const gather = &synced.gather;
        const bytes = gather.record_bytes;
        const start = batch_number * gather.batch;
        for (j * gather.batch / synced.threads..(j + 1) * gather.batch / synced.threads) |k| {
            const index = gather.indices[start + k];
            _ = gather.copy(gather.target + k * bytes, gather.source + index * bytes, bytes);
        }
    }

    fn worker(synced: *Synced, j: usize) void {
        var seen: u32 = 0;
        while (true) {
            var now = synced.generation.load(.acquire);
            while (now == seen) : (now = synced.generation.load(.acquire)) {
                if (synced.spin) std.atomic.spinLoopHint() else std.Thread.Futex.wait(
                    &synced.generation,
                    seen,
                );
            }
            seen = now;
            if (seen == stop) return;
            synced.rows(j, seen - 1);
            _ = synced.done.fetchAdd(1, .release);
            if (!synced.spin) std.Thread.Futex.wake(&synced.done, 1);
        }
    }

    fn publish(synced: *Synced, generation: u32) void {
        synced.generation.store(generation, .release);
        if (!synced.spin) std.Thread.Futex.wake(&synced.generation, std.math.maxInt(u32));
    }

    fn waitDone(synced: *Synced) void {
        const workers: u32 = @intCast(synced.threads - 1);
        var done = synced.done.load(.acquire);
        while (done < workers) : (done = synced.done.load(.acquire)) {
            if (synced.spin) std.atomic.spinLoopHint() else std.Thread.Futex.wait(
                &synced.done,
                done,
            );
        }
    }
};

export fn memory_gather_synced(
    source: [*]const u8,
    record_bytes: usize,
    indices: [*]const u64,
    count: usize,
    batch: usize,
    target: [*]u8,
    threads: usize,
    copy: u32,
    spin: u32,
) u64 {
    if (batch == 0 or count % batch != 0 or threads == 0 or threads > 1024) return 0;
    if (count / batch >= Synced.stop) return 0;
    const chosen: Copy = if (copy == 1) &zigCopy else libcCopy() orelse return 0;
    var synced = Synced{
        .gather = .{
            .source = source,
            .record_bytes = record_bytes,
            .indices = indices[0..count],
            .batch = batch,
            .target = target,
            .copy = chosen,
        },
        .threads = threads,
        .spin = spin != 0,
    };
    var spawned: [1024]std.Thread = undefined;
    var started: usize = 1;
    defer {
        synced.publish(Synced.stop);
        for (spawned[1..started]) |thread| thread.join();
    }
    while (started < threads) : (started += 1) {
        spawned[started] = std.Thread.spawn(.{}, Synced.worker, .{ &synced, started }) catch
            return 0;
    }
    var timer = std.time.Timer.start() catch return 0;
    for (0..count / batch) |batch_number| {
        synced.done.store(0, .release);
        synced.publish(@intCast(batch_number + 1));
        synced.rows(0, batch_number);
        synced.waitDone();
    }
    return timer.read();
}
