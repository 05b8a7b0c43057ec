//! A sharded dataset read as one: batch gathers and length lookups over many
//! stores in one call, so a batch that touches 64 shards costs one crossing
//! of the C ABI instead of 64.
//!
//! Invariant: `row_starts` is validated once, when the handle is made; every
//! call maps a global index to (shard, local index) through it and hands each
//! shard's part of the batch to that store's public `gather` or `lengths`,
//! which check their own indices and destination bounds again. The handle
//! does not own the stores: the caller keeps them open while it lives.
const std = @import("std");
const assert = std.debug.assert;
const status = @import("status.zig");
const workers = @import("workers.zig");
const format = @import("format.zig");
const ragged = @import("ragged.zig");
const Store = @import("store.zig").Store;
const Error = status.Error;

const allocator = std.heap.c_allocator;

/// A manifest lists at most this many shards (loaderx.shards checks it too).
pub const shard_count_max: u64 = 1 << 20;

/// Below this many bytes a store's own gather runs inline (workers.zig's
/// limit): dense pieces are cut smaller, so a store called from a worker
/// thread does not enter the pool again.
const store_inline_bytes: u64 = 256 * 1024;

/// Global rows to shards. A row's shard is found in a table of buckets of
/// 2^k rows, at most `buckets_per_shard` buckets per shard, then by a
/// search among the few shards that overlap the bucket (one or two when
/// shards are of similar size): a binary search over all the shards was a
/// chain of dependent loads, about 25 ns a record with 64 shards.
pub const RowIndex = struct {
    /// `row_starts.len - 1` shards: shard s holds global rows
    /// `row_starts[s]..row_starts[s + 1]`.
    row_starts: []u64,
    /// Entry b is the shard holding row `b << bucket_shift`; the last entry
    /// is the shard holding the last row.
    bucket_shards: []u32,
    bucket_shift: u6,

    const buckets_per_shard = 4;

    comptime {
        assert(shard_count_max <= std.math.maxInt(u32));
    }

    /// Indexes `row_starts` (validated by the caller: increasing, from 0,
    /// at most `shard_count_max + 1` entries); keeps a copy.
    pub fn init(row_starts: []const u64) Error!RowIndex {
        assert(
            row_starts.len >= 2 and row_starts.len <= shard_count_max + 1 and row_starts[0] == 0,
        );
        const shard_count = row_starts.len - 1;
        const total = row_starts[shard_count];
        // The smallest power of two at or above total / (buckets_per_shard *
        // shard_count) rows, so there are at most that many buckets. Four
        // per shard leave most buckets inside one shard (no search step),
        // for 16 bytes a shard.
        const bucket_rows_min = @max(
            1,
            std.math.divCeil(u64, total, buckets_per_shard * shard_count) catch unreachable,
        );
        const bucket_shift: u6 = @intCast(std.math.log2_int_ceil(u64, bucket_rows_min));
        const bucket_count: usize = if (total == 0)
            0
        else
            @intCast(((total - 1) >> bucket_shift) + 1);
        assert(bucket_count <= buckets_per_shard * shard_count);
        const starts_copy = allocator.dupe(u64, row_starts) catch return error.OutOfMemory;
        errdefer allocator.free(starts_copy);
        const bucket_shards = allocator.alloc(u32, bucket_count + 1) catch return error.OutOfMemory;
        var shard: usize = 0;
        for (bucket_shards, 0..) |*entry, bucket| {
            const row = if (bucket < bucket_count) @as(u64, bucket) << bucket_shift else total -| 1;
            while (shard + 1 < shard_count and row_starts[shard + 1] <= row) shard += 1;
            entry.* = @intCast(shard);
        }
        return .{
            .row_starts = starts_copy,
            .bucket_shards = bucket_shards,
            .bucket_shift = bucket_shift,
        };
    }

    pub fn deinit(rows: *RowIndex) void {
        allocator.free(rows.row_starts);
        allocator.free(rows.bucket_shards);
    }

    pub fn count(rows: *const RowIndex) u64 {
        return rows.row_starts[rows.row_starts.len - 1];
    }

    /// The shard holding global row `index` (< count): the last shard whose
    /// first row is at or before it, skipping empty shards. It lies between
    /// the entries of the row's bucket and of the next; the halving step is
    /// a conditional move, not a branch, since batch indices are random.
    pub fn shardOf(rows: *const RowIndex, index: u64) usize {
        assert(index < rows.count());
        const bucket: usize = @intCast(index >> rows.bucket_shift);
        var low: usize = rows.bucket_shards[bucket];
        var length: usize = rows.bucket_shards[bucket + 1] - low + 1;
        while (length > 1) {
            const half = length / 2;
            low += half * @intFromBool(rows.row_starts[low + half] <= index);
            length -= half;
        }
        assert(rows.row_starts[low] <= index and index < rows.row_starts[low + 1]);
        return low;
    }
};

pub const Shards = struct {
    stores: []*Store,
    rows: RowIndex,
    threads: u32,

    pub fn create(stores: []const *Store, row_starts: []const u64, threads: u32) Error!*Shards {
        status.clear();
        if (stores.len == 0 or stores.len > shard_count_max) {
            return status.fail(
                error.InvalidArgument,
                "a sharded dataset needs 1 to {d} shards, got {d}",
                .{ shard_count_max, stores.len },
            );
        }
        if (row_starts.len != stores.len + 1 or row_starts[0] != 0) {
            return status.fail(
                error.InvalidArgument,
                "row_starts must have one entry per shard plus one, starting at 0",
                .{},
            );
        }
        for (stores, row_starts[0..stores.len], row_starts[1..], 0..) |store, start, end, shard| {
            if (end < start or store.count() < end - start) {
                return status.fail(
                    error.InvalidArgument,
                    "shard {d} is listed with rows {d}..{d} but holds {d} records",
                    .{ shard, start, end, store.count() },
                );
            }
        }
        const shards = allocator.create(Shards) catch return error.OutOfMemory;
        errdefer allocator.destroy(shards);
        const stores_copy = allocator.dupe(*Store, stores) catch return error.OutOfMemory;
        errdefer allocator.free(stores_copy);
        shards.* = .{
            .stores = stores_copy,
            .rows = try RowIndex.init(row_starts),
            .threads = if (threads == 0) workers.cpuCount() else threads,
        };
        return shards;
    }

    pub fn destroy(shards: *Shards) void {
        allocator.free(shards.stores);
        shards.rows.deinit();
        allocator.destroy(shards);
    }

    pub fn count(shards: *const Shards) u64 {
        return shards.rows.count();
    }

    /// Decodes global records `indices` into `target`: record k at byte
    /// `target_offsets[k]` or, without offsets, at `k * record_bytes`, in
    /// which case every record must be `record_bytes` long.
    pub fn gather(
        shards: *const Shards,
        indices: []const u64,
        target: []u8,
        target_offsets: ?[]const u64,
        record_bytes: u64,
    ) Error!void {
        status.clear();
        var plan = try Plan.make(shards, indices);
        defer plan.deinit();
        for (plan.positions, plan.offsets) |position, *offset| {
            offset.* = if (target_offsets) |offsets|
                offsets[position]
            else
                std.math.mul(u64, position, record_bytes) catch
                    return status.fail(
                        error.BufferTooSmall,
                        "record {d} lands past the end of any destination",
                        .{indices[position]},
                    );
        }
        try run(shards, &plan, target, if (target_offsets == null) record_bytes else null);
    }

    /// Copies the records of `plan` to `plan.offsets` in `target`. With
    /// `record_bytes` set, every record must be that long.
    fn run(shards: *const Shards, plan: *const Plan, target: []u8, record_bytes: ?u64) Error!void {
        var job = GatherJob{
            .shards = shards,
            .plan = plan,
            .target = target,
            .record_bytes = record_bytes,
            .piece_records = if (record_bytes != null and record_bytes.? > 0)
                @max(1, (store_inline_bytes - 1) / record_bytes.?)
            else
                std.math.maxInt(usize),
        };
        // Split by records, not by shards, so every thread gets an even share
        // however the batch falls into shards.
        workers.parallelFor(plan.positions.len, target.len, shards.threads, &job, GatherJob.run);
        try job.failure.check();
    }

    /// The ragged gather of ragged.zig over shards: records `indices` packed
    /// from the start of `target`, `offsets` (`indices.len + 1`) their row
    /// offsets. Returns the bytes the batch needs; if more than
    /// `target.len`, nothing was read and `offsets` hold byte offsets.
    pub fn gatherRows(
        shards: *const Shards,
        indices: []const u64,
        row_bytes: u64,
        target: []u8,
        offsets: []u64,
    ) Error!u64 {
        status.clear();
        assert(offsets.len == indices.len + 1);
        var plan = try Plan.make(shards, indices);
        defer plan.deinit();
        try plan.readLengths(shards);
        for (plan.positions, plan.offsets) |position, length| offsets[position + 1] = length;
        const total = try ragged.packLengths(indices, offsets, row_bytes);
        if (total > target.len) return total;
        for (plan.positions, plan.offsets) |position, *offset| offset.* = offsets[position];
        try run(shards, &plan, target[0..total], null);
        ragged.toRows(offsets, row_bytes);
        return total;
    }

    /// The decoded byte length of each global record in `indices`.
    pub fn lengths(shards: *const Shards, indices: []const u64, out: []u64) Error!void {
        status.clear();
        assert(indices.len == out.len);
        var plan = try Plan.make(shards, indices);
        defer plan.deinit();
        try plan.readLengths(shards);
        for (plan.positions, plan.offsets) |position, length| out[position] = length;
    }
};

/// A batch regrouped by shard: entry i of the sorted order is the caller's
/// record `positions[i]`, local index `locals[i]` of its shard; `groups`
/// are the runs of one shard. `offsets` is scratch of the same length.
const Plan = struct {
    positions: []u64,
    locals: []u64,
    offsets: []u64,
    groups: []Group,

    const Group = struct { shard: usize, start: usize, end: usize };

    fn make(shards: *const Shards, indices: []const u64) Error!Plan {
        const total = shards.count();
        const plan_buffer = allocator.alloc(u64, 3 * indices.len) catch return error.OutOfMemory;
        errdefer allocator.free(plan_buffer);
        var plan = Plan{
            .positions = plan_buffer[0..indices.len],
            .locals = plan_buffer[indices.len .. 2 * indices.len],
            .offsets = plan_buffer[2 * indices.len ..],
            .groups = &.{},
        };
        // `locals` holds each position's shard until the positions are sorted.
        const shard_of = plan.locals;
        for (indices, shard_of) |index, *shard| {
            if (index >= total) {
                return status.fail(
                    error.IndexOutOfRange,
                    "index {d} is out of range for a dataset of {d} records",
                    .{ index, total },
                );
            }
            shard.* = shards.rows.shardOf(index);
        }
        sortByShard(shard_of, plan.positions, plan.offsets, shards.stores.len);
        var group_count: usize = 0;
        for (plan.positions, plan.offsets, 0..) |position, *shard, i| {
            shard.* = shard_of[position];
            if (i == 0 or plan.offsets[i - 1] != shard.*) group_count += 1;
        }
        plan.groups = allocator.alloc(Group, group_count) catch return error.OutOfMemory;
        var group: usize = 0;
        for (plan.positions, plan.offsets, plan.locals, 0..) |position, shard, *local, i| {
            if (i > 0 and plan.offsets[i - 1] != shard) group += 1;
            if (i == 0 or plan.offsets[i - 1] != shard)
                plan.groups[group] = .{ .shard = shard, .start = i, .end = i };
            plan.groups[group].end = i + 1;
            local.* = indices[position] - shards.rows.row_starts[shard];
        }
        assert(indices.len == 0 or group + 1 == group_count);
        return plan;
    }

    /// Fills `offsets` with the decoded length of each sorted record, one
    /// call of each shard's store.
    fn readLengths(plan: *const Plan, shards: *const Shards) Error!void {
        for (plan.groups) |group| {
            const part = plan.offsets[group.start..group.end];
            shards.stores[group.shard].lengths(
                plan.locals[group.start..group.end],
                part,
            ) catch |err| {
                // The message is copied out before it is rewritten with the shard's number.
                var failure: Failure = .{};
                failure.set(err, group.shard);
                return failure.check();
            };
        }
    }

    /// The group holding sorted record `record` (< positions.len).
    fn groupAt(plan: *const Plan, record: usize) usize {
        assert(record < plan.positions.len);
        var low: usize = 0;
        var high: usize = plan.groups.len;
        while (high - low > 1) {
            const middle = low + (high - low) / 2;
            if (plan.groups[middle].start <= record) low = middle else high = middle;
        }
        assert(plan.groups[low].start <= record and record < plan.groups[low].end);
        return low;
    }

    fn deinit(plan: *Plan) void {
        allocator.free(plan.positions.ptr[0 .. 3 * plan.positions.len]);
        allocator.free(plan.groups);
    }
};

/// Fills `order` with the positions 0..n sorted by `shard_of[position]`,
/// keeping positions in order within a shard: a least-significant-digit
/// radix sort on 8-bit digits, one pass per digit of the largest shard
/// number (one pass up to 256 shards, three at `shard_count_max`). A
/// comparison sort of a 256-record batch cost more than the copies of a raw
/// gather's 64 shard runs. `spare` is scratch of the same length.
fn sortByShard(shard_of: []const u64, order: []u64, spare: []u64, shard_count: usize) void {
    assert(order.len == shard_of.len and spare.len == shard_of.len);
    assert(shard_count >= 1 and shard_count <= shard_count_max);
    for (order, 0..) |*position, i| position.* = i;
    var source = order;
    var target = spare;
    var shift: u6 = 0;
    while ((shard_count - 1) >> shift != 0) : (shift += 8) {
        var starts = [_]u64{0} ** 257;
        for (source) |position| starts[((shard_of[position] >> shift) & 0xff) + 1] += 1;
        for (1..starts.len) |digit| starts[digit] += starts[digit - 1];
        for (source) |position| {
            const digit = (shard_of[position] >> shift) & 0xff;
            target[starts[digit]] = position;
            starts[digit] += 1;
        }
        std.mem.swap([]u64, &source, &target);
    }
    if (source.ptr != order.ptr) @memcpy(order, source);
}

/// The first failing shard of a gather, with the message its thread recorded
/// (messages are per thread, so it is copied before the task ends).
const Failure = struct {
    mutex: std.Thread.Mutex = .{},
    err: ?Error = null,
    shard: usize = 0,
    message: [256]u8 = undefined,
    message_len: usize = 0,

    fn set(failure: *Failure, err: Error, shard: usize) void {
        failure.mutex.lock();
        defer failure.mutex.unlock();
        if (failure.err != null and failure.shard <= shard) return;
        const text = status.message();
        failure.message_len = @min(text.len, failure.message.len);
        @memcpy(failure.message[0..failure.message_len], text[0..failure.message_len]);
        failure.err = err;
        failure.shard = shard;
    }

    fn check(failure: *Failure) Error!void {
        const err = failure.err orelse return;
        return status.fail(
            err,
            "shard {d}: {s}",
            .{ failure.shard, failure.message[0..failure.message_len] },
        );
    }
};

const GatherJob = struct {
    shards: *const Shards,
    plan: *const Plan,
    target: []u8,
    /// Set when records land at `k * record_bytes`: each must be that long.
    record_bytes: ?u64,
    piece_records: usize,
    failure: Failure = .{},

    /// Gathers sorted records `first..last`: each run of one shard, in
    /// pieces of at most `piece_records`, is one call of that store.
    fn run(job: *GatherJob, first: u64, last: u64) void {
        const end_all: usize = @intCast(last);
        var start: usize = @intCast(first);
        var group_index = job.plan.groupAt(start);
        while (start < end_all) {
            const group = job.plan.groups[group_index];
            const end = @min(end_all, group.end, start + @min(job.piece_records, end_all - start));
            job.gatherPiece(group.shard, start, end) catch |err| job.failure.set(err, group.shard);
            start = end;
            if (start == group.end) group_index += 1;
        }
    }

    fn gatherPiece(job: *GatherJob, shard: usize, start: usize, end: usize) Error!void {
        const store = job.shards.stores[shard];
        const locals = job.plan.locals[start..end];
        const offsets = job.plan.offsets[start..end];
        if (job.record_bytes) |record_bytes| {
            // A fixed layout holds every record at one length, so only an
            // indexed shard needs its records' lengths checked one by one.
            const info = store.info();
            const fixed = info.layout == @intFromEnum(format.Layout.fixed) and
                info.record_bytes == record_bytes;
            if (!fixed) try checkLengths(store, locals, record_bytes);
        }
        try store.gather(locals, job.target, offsets);
    }
};

/// Refuses a record whose length is not `record_bytes`, in bounded chunks so
/// the check allocates nothing.
fn checkLengths(store: *Store, locals: []const u64, record_bytes: u64) Error!void {
    var lengths: [256]u64 = undefined;
    var start: usize = 0;
    while (start < locals.len) : (start += lengths.len) {
        const part = locals[start..@min(locals.len, start + lengths.len)];
        try store.lengths(part, lengths[0..part.len]);
        for (part, lengths[0..part.len]) |local, length| {
            if (length != record_bytes) {
                return status.fail(
                    error.Corrupt,
                    "record {d} has {d} bytes, but every record of this dense dataset has {d}",
                    .{ local, length, record_bytes },
                );
            }
        }
    }
}

test "shardOf finds the shard of every row, skipping empty shards" {
    var rows = try RowIndex.init(&.{ 0, 3, 3, 7, 8 });
    defer rows.deinit();
    const expected = [_]usize{ 0, 0, 0, 2, 2, 2, 2, 3 };
    for (expected, 0..) |shard, index| try std.testing.expectEqual(shard, rows.shardOf(index));
}

test "shardOf agrees with a linear scan on even, skewed and empty shards" {
    var prng = std.Random.DefaultPrng.init(11);
    const random = prng.random();
    var row_starts: [201]u64 = undefined;
    for (0..100) |_| {
        const shard_count = 1 + random.uintLessThan(usize, 200);
        row_starts[0] = 0;
        for (1..shard_count + 1) |shard| {
            // Mostly even shards, some empty, a few up to a hundred times larger.
            const size: u64 = switch (random.uintLessThan(u8, 8)) {
                0 => 0,
                1 => 100 * (1 + random.uintLessThan(u64, 20)),
                else => 1 + random.uintLessThan(u64, 50),
            };
            row_starts[shard] = row_starts[shard - 1] + size;
        }
        var rows = try RowIndex.init(row_starts[0 .. shard_count + 1]);
        defer rows.deinit();
        try std.testing.expect(
            rows.bucket_shards.len <= RowIndex.buckets_per_shard * shard_count + 1,
        );
        var expected: usize = 0;
        for (0..rows.count()) |index| {
            while (row_starts[expected + 1] <= index) expected += 1;
            try std.testing.expectEqual(expected, rows.shardOf(index));
        }
    }
}

test "a plan groups a batch by shard and keeps the caller's positions" {
    var stores: [3]*Store = undefined;
    const shards = Shards{
        .stores = &stores,
        .rows = try RowIndex.init(&.{ 0, 2, 5, 9 }),
        .threads = 1,
    };
    defer @constCast(&shards.rows).deinit();
    var plan = try Plan.make(&shards, &.{ 8, 0, 4, 1, 5 });
    defer plan.deinit();
    try std.testing.expectEqualSlices(u64, &.{ 1, 3, 2, 0, 4 }, plan.positions);
    try std.testing.expectEqualSlices(u64, &.{ 0, 1, 2, 3, 0 }, plan.locals);
    try std.testing.expectEqual(@as(usize, 3), plan.groups.len);
    try std.testing.expectEqual(@as(usize, 3), plan.groups[2].start);
    for ([_]usize{ 0, 0, 1, 2, 2 }, 0..) |group, record| try std.testing.expectEqual(
        group,
        plan.groupAt(record),
    );
    try std.testing.expectError(error.IndexOutOfRange, Plan.make(&shards, &.{9}));
}

test "sortByShard groups positions by shard, in order within one, in 1 to 3 digit passes" {
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    for ([_]usize{ 1, 2, 64, 300, 70_000, shard_count_max }) |shard_count| {
        var shard_of: [500]u64 = undefined;
        for (&shard_of) |*shard| shard.* = random.uintLessThan(u64, shard_count);
        var order: [500]u64 = undefined;
        var spare: [500]u64 = undefined;
        sortByShard(&shard_of, &order, &spare, shard_count);
        var seen = [_]bool{false} ** 500;
        for (order, 0..) |position, i| {
            try std.testing.expect(!seen[position]);
            seen[position] = true;
            if (i == 0) continue;
            const previous = order[i - 1];
            try std.testing.expect(shard_of[previous] < shard_of[position] or
                (shard_of[previous] == shard_of[position] and previous < position));
        }
    }
}
