//! zsampler: the index streams behind `loaderx.sampler.Sampler`.
//!
//! Every batch is a pure function of (config, step). Nothing is carried from
//! one batch to the next, so `seek` is free, a resumed run continues exactly,
//! and many hosts each compute their slice of one global stream without
//! talking to each other.
//!
//! The global stream. With `world_size` w ranks of `batch_size` B indices
//! each, the global batch at step k holds G = B * w indices, and rank r owns
//! its positions [r * B, (r + 1) * B). Concatenating the ranks' batches in
//! rank order gives exactly the batch of one process with batch_size G.
//!
//! The modes:
//! - sequential: global batch k is (k * G + j) mod length for j in 0..G, a
//!   window sliding over the index space that wraps around its end.
//! - iid: uniform with replacement. Index j of batch k is Lemire's
//!   multiply-shift reduction of a counter-based hash of (seed, k, j), with
//!   rejection, so it is unbiased for every length.
//! - cyclic: without replacement. Cycle c is a keyed pseudo-random
//!   permutation of 0..length (its own keys per cycle) read in batches; the
//!   last `length mod G` positions of each permutation are dropped so every
//!   batch is whole, and they are different indices in each cycle. Lengths
//!   up to 256 are shuffled exactly (Fisher-Yates on the stack); longer ones
//!   go through a keyed Feistel network with cycle-walking (see
//!   `Permutation`). Nothing of dataset size is ever allocated.
//! - block: without replacement, local to groups of records (a sharded
//!   dataset's shards). Cycle c permutes the groups (keyed by seed and c),
//!   cuts that order into blocks of `per_block` consecutive groups (the last
//!   block may hold fewer), and permutes the records of each block together
//!   (keyed by seed, c and the block); the cycle's stream is the blocks'
//!   streams one after another, read in batches and cut as in cyclic mode
//!   (the last `length mod G` positions, the end of the cycle's last block,
//!   are dropped). A batch costs O(groups) for the cycle's group order and
//!   its prefix sums, in a caller's scratch buffer, plus O(log groups) per
//!   index to find its block and group (`batchBlock`).
//!
//! Limits: length in 1..2^63 (every index fits an int64 as well as a u64),
//! G must fit a u64, and cyclic and block need length >= G so a cycle holds
//! a batch; block takes 1..`groups_max` groups.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const status = @import("status.zig");

pub const Mode = enum(u32) {
    sequential = 0,
    iid = 1,
    cyclic = 2,
    block = 3,
};

/// The C ABI's `lx_sampler_config`; Python checks its size against
/// `lx_sampler_config_bytes()` at import.
pub const Config = extern struct {
    length: u64,
    /// This rank's share of the global batch.
    batch_size: u64,
    seed: u64,
    rank: u64,
    world_size: u64,
    mode: u32,
    /// Must be zero, so a later field can give it a meaning.
    reserved: u32,

    comptime {
        assert(@sizeOf(Config) == 48);
        assert(@alignOf(Config) == 8);
    }

    fn globalBatchSize(config: *const Config) u64 {
        return config.batch_size * config.world_size;
    }
};

/// Indices must fit a signed 64-bit integer, the index type of NumPy.
pub const length_max: u64 = 1 << 63;

/// Rejects every config `batch` cannot serve, with a message that says what
/// to change. Callers from the outside world validate before every batch.
pub fn validate(config: *const Config) status.Error!void {
    const invalid = error.InvalidArgument;
    if (std.meta.intToEnum(Mode, config.mode)) |_| {} else |_| {
        return status.fail(invalid, "sampler mode {d} is unknown: use 0 (SEQUENTIAL), " ++
            "1 (IID), 2 (CYCLIC) or 3 (BLOCK)", .{config.mode});
    }
    if (config.reserved != 0) {
        return status.fail(
            invalid,
            "sampler config field `reserved` is {d}: set it to 0",
            .{config.reserved},
        );
    }
    if (config.length == 0) {
        return status.fail(invalid, "sampler length is 0: the index space must hold at least " ++
            "one index (is the dataset empty?)", .{});
    }
    if (config.length > length_max) {
        return status.fail(invalid, "sampler length {d} is above 2^63: indices must fit a " ++
            "signed 64-bit integer", .{config.length});
    }
    if (config.batch_size == 0) {
        return status.fail(
            invalid,
            "sampler batch_size is 0: ask for at least one index per batch",
            .{},
        );
    }
    if (config.world_size == 0) {
        return status.fail(invalid, "sampler world_size is 0: a shard (rank, world_size) " ++
            "needs world_size >= 1", .{});
    }
    if (config.rank >= config.world_size) {
        return status.fail(invalid, "sampler rank {d} is outside 0..{d}: rank must be below " ++
            "world_size", .{ config.rank, config.world_size });
    }
    if (@mulWithOverflow(config.batch_size, config.world_size)[1] != 0) {
        return status.fail(invalid, "sampler batch_size {d} * world_size {d} overflows 64 bits: " ++
            "use a smaller batch or fewer ranks", .{ config.batch_size, config.world_size });
    }
    if (withoutReplacement(config) and config.length < config.globalBatchSize()) {
        const name = if (config.mode == @intFromEnum(Mode.block)) "BLOCK" else "CYCLIC";
        return status.fail(invalid, "{s} sampling without replacement needs a whole global " ++
            "batch per cycle, but length {d} < batch_size * world_size = {d}: use a smaller " ++
            "batch or IID", .{ name, config.length, config.globalBatchSize() });
    }
}

fn withoutReplacement(config: *const Config) bool {
    return config.mode == @intFromEnum(Mode.cyclic) or config.mode == @intFromEnum(Mode.block);
}

fn isValid(config: *const Config) bool {
    return config.mode <= @intFromEnum(Mode.block) and config.reserved == 0 and
        config.length >= 1 and config.length <= length_max and
        config.batch_size >= 1 and config.rank < config.world_size and
        @mulWithOverflow(config.batch_size, config.world_size)[1] == 0 and
        (!withoutReplacement(config) or config.length >= config.globalBatchSize());
}

/// Writes this rank's `batch_size` indices of batch `step` into `target`.
/// The config must have passed `validate` and not be BLOCK (`batchBlock`).
pub fn batch(config: *const Config, step: u64, target: []u64) void {
    assert(isValid(config));
    assert(target.len == config.batch_size);
    switch (@as(Mode, @enumFromInt(config.mode))) {
        .sequential => batchSequential(config, step, target),
        .iid => batchIid(config, step, target),
        .cyclic => batchCyclic(config, step, target),
        .block => unreachable, // needs the groups: batchBlock
    }
}

fn batchSequential(config: *const Config, step: u64, target: []u64) void {
    // step * G reaches 2^128 at most, so the start is exact for every step.
    const position = @as(u128, step) * config.globalBatchSize() + config.rank * config.batch_size;
    var index: u64 = @intCast(position % config.length);
    for (target) |*slot| {
        slot.* = index;
        index += 1;
        if (index == config.length) index = 0;
    }
    assert(index < config.length);
}

fn batchIid(config: *const Config, step: u64, target: []u64) void {
    // SplitMix64 with a per-batch starting point: the start is a hash of
    // (seed, step), draw j hashes start + (first + j + 1) * gamma. Distinct
    // steps start at unrelated points of the 2^64 counter space, so batches
    // overlap only with probability about G^2 / 2^64.
    const start = mix(mix(config.seed ^ domain_iid) +% step *% gamma_step);
    const first = config.rank * config.batch_size;
    var counter = start +% first *% gamma;
    const done = if (iid_lanes > 1) iidVector(counter, config.length, target) else 0;
    counter +%= done *% gamma;
    for (target[done..]) |*slot| {
        counter +%= gamma;
        slot.* = bounded(mix(counter), config.length);
    }
}

/// x86-64 with AVX2 (the v3 and v4 builds): the vector forms of the IID
/// hash and of `reduce` below multiply u64 lanes with `vpmuludq`. They were
/// measured slower with SSE2 alone (half the width, no `vpblendd`), and
/// 64-bit Arm has no u64 lane multiply at all.
const x86_avx2 = builtin.cpu.arch == .x86_64 and builtin.cpu.has(.x86, .avx2);

/// Draws per step of `iidVector`, or 1 for the scalar loop. The hashes of 8
/// draws (two AVX2 registers, one AVX-512) go through the vector unit while
/// `bounded`'s 128-bit multiplies stay on the scalar one, which the scalar
/// loop keeps busy with all three multiplies of a draw: 1.9x faster on Zen 3.
const iid_lanes = if (x86_avx2) 8 else 1;

/// Writes the first draws of `batchIid`, `iid_lanes` at a time, and returns
/// how many (a multiple of `iid_lanes`); the caller draws the rest.
fn iidVector(counter: u64, length: u64, target: []u64) usize {
    comptime assert(iid_lanes > 1);
    const Lanes = @Vector(iid_lanes, u64);
    const draws = std.simd.iota(u64, iid_lanes) + @as(Lanes, @splat(1));
    var counters = @as(Lanes, @splat(counter)) +% draws *% @as(Lanes, @splat(gamma));
    var done: usize = 0;
    while (done + iid_lanes <= target.len) : (done += iid_lanes) {
        const randoms: [iid_lanes]u64 = mixLanes(iid_lanes, counters);
        // Unrolled: left a loop, its shape (and speed) would vary with the
        // CPU model the compiler tunes for.
        inline for (target[done..][0..iid_lanes], randoms) |*slot, random| slot.* = bounded(
            random,
            length,
        );
        counters +%= @splat(iid_lanes *% gamma);
    }
    assert(done % iid_lanes == 0 and target.len - done < iid_lanes);
    return done;
}

fn batchCyclic(config: *const Config, step: u64, target: []u64) void {
    // G divides `usable`, so a global batch never straddles two cycles and
    // both the cycle and the offset inside it fit in a u64.
    const batches_per_cycle = config.length / config.globalBatchSize();
    assert(batches_per_cycle >= 1);
    const cycle = step / batches_per_cycle;
    const offset = (step % batches_per_cycle) * config.globalBatchSize() +
        config.rank * config.batch_size;
    assert(offset + target.len <= config.length);

    const key = mix(mix(config.seed ^ domain_cyclic) +% cycle *% gamma_step);
    permuteRange(config.length, key, offset, target);
}

/// Positions offset.. of the keyed permutation of 0..length: an exact
/// shuffle up to `shuffle_length_max`, the Feistel network above.
fn permuteRange(length: u64, key: u64, offset: u64, target: []u64) void {
    assert(offset + target.len <= length);
    if (length <= shuffle_length_max) {
        shuffleBatch(length, key, offset, target);
    } else {
        Permutation.init(length, key).fill(offset, target);
    }
}

/// Up to this length an exact shuffle is cheap (under a microsecond), while
/// a Feistel network has halves only a few bits wide and its permutations
/// are measurably uneven: at length 5, even twelve rounds fail a chi-square
/// test of pairs over 200_000 cycles.
const shuffle_length_max = 256;

/// Positions offset.. of an exact Fisher-Yates shuffle of 0..length, drawn
/// from the cycle's key. Rebuilt per batch: O(length) on the stack.
fn shuffleBatch(length: u64, key: u64, offset: u64, target: []u64) void {
    assert(length >= 1 and length <= shuffle_length_max);
    assert(offset + target.len <= length);
    var order: [shuffle_length_max]u8 = undefined;
    for (order[0..length], 0..) |*slot, index| slot.* = @intCast(index);
    var remaining = length;
    while (remaining > 1) : (remaining -= 1) {
        const chosen = bounded(mix(key +% remaining *% gamma), remaining);
        std.mem.swap(u8, &order[remaining - 1], &order[chosen]);
    }
    for (target, order[offset..][0..target.len]) |*slot, index| slot.* = index;
}

// ---- block mode -------------------------------------------------------------

/// The most groups BLOCK mode takes: the most shards one sharded dataset
/// holds (`shard_count_max` in shards.zig). A batch's scratch is then at
/// most 16 MiB, and laying out a cycle's groups a few milliseconds.
pub const groups_max: u64 = 1 << 20;

/// BLOCK mode's groups, the C ABI's `lx_sampler_blocks`: group g holds the
/// indices starts[g]..starts[g + 1].
pub const Blocks = extern struct {
    /// group_count + 1 entries: 0, strictly increasing, ending at length.
    starts: [*]const u64,
    group_count: u64,
    /// Groups per block, >= 1; at group_count or above, one block holds all.
    per_block: u64,
    /// Caller-owned, `scratchCount(group_count)` slots at least, written by
    /// every batch: one buffer per concurrent call.
    scratch: [*]u64,
    scratch_count: u64,

    comptime {
        assert(@sizeOf(Blocks) == 40);
    }
};

pub fn scratchCount(group_count: u64) u64 {
    return 2 * group_count + 1;
}

/// Rejects groups `batchBlock` cannot serve with this (BLOCK) config.
pub fn validateBlocks(config: *const Config, blocks: *const Blocks) status.Error!void {
    try validate(config);
    const invalid = error.InvalidArgument;
    if (config.mode != @intFromEnum(Mode.block)) {
        return status.fail(invalid, "sampler groups are for mode 3 (BLOCK), but the mode is " ++
            "{d}: call lx_sampler_batch", .{config.mode});
    }
    if (blocks.group_count == 0 or blocks.group_count > groups_max) {
        return status.fail(invalid, "BLOCK sampling takes 1..{d} groups, got {d}", .{
            groups_max,
            blocks.group_count,
        });
    }
    if (blocks.per_block == 0) {
        return status.fail(invalid, "BLOCK shards_per_block is 0: a block holds at least " ++
            "one group", .{});
    }
    if (blocks.scratch_count < scratchCount(blocks.group_count)) {
        return status.fail(error.BufferTooSmall, "BLOCK scratch holds {d} slots but {d} " ++
            "groups need 2 * groups + 1 = {d}", .{
            blocks.scratch_count,
            blocks.group_count,
            scratchCount(blocks.group_count),
        });
    }
    const starts = blocks.starts[0 .. blocks.group_count + 1];
    if (starts[0] != 0 or starts[starts.len - 1] != config.length) {
        return status.fail(invalid, "BLOCK group starts run from {d} to {d}, not from 0 to " ++
            "the sampler length {d}: the groups' rows must add up to the length", .{
            starts[0],
            starts[starts.len - 1],
            config.length,
        });
    }
    for (starts[0 .. starts.len - 1], starts[1..], 0..) |start, end, group| {
        if (end <= start) {
            return status.fail(invalid, "BLOCK group {d} holds no rows (indices {d}..{d}): " ++
                "every group needs at least one row", .{ group, start, end });
        }
    }
}

/// Writes this rank's `batch_size` indices of BLOCK batch `step` into
/// `target`. Both arguments must have passed `validateBlocks`. Positions
/// are (cycle, offset) exactly as in cyclic mode.
pub fn batchBlock(config: *const Config, blocks: *const Blocks, step: u64, target: []u64) void {
    assert(isValid(config) and config.mode == @intFromEnum(Mode.block));
    assert(target.len == config.batch_size);
    const batches_per_cycle = config.length / config.globalBatchSize();
    assert(batches_per_cycle >= 1);
    const cycle = step / batches_per_cycle;
    const offset = (step % batches_per_cycle) * config.globalBatchSize() +
        config.rank * config.batch_size;
    assert(offset + target.len <= config.length);
    Layout.init(config.seed, cycle, blocks).fill(offset, target);
}

/// Writes the indices at positions offset.. of BLOCK cycle `cycle` into
/// `target`: any run of a cycle, for a stream resumed at a position that
/// is not a multiple of the batch (the elastic anchor). `blocks` must have
/// passed `validateBlocks`.
pub fn positionsBlock(
    config: *const Config,
    blocks: *const Blocks,
    cycle: u64,
    offset: u64,
    target: []u64,
) void {
    assert(isValid(config) and config.mode == @intFromEnum(Mode.block));
    assert(offset <= config.length and target.len <= config.length - offset);
    if (target.len == 0) return;
    Layout.init(config.seed, cycle, blocks).fill(offset, target);
}

/// One cycle's arrangement of the groups, in the caller's scratch: slot i of
/// the cycle's group order holds the group whose first index is firsts[i],
/// and the slots before it hold ends[i] records (ends[groups] = length).
/// Block b is slots b * per_block.. and positions ends[b * per_block]..
const Layout = struct {
    firsts: []u64,
    ends: []u64,
    per_block: u64,
    block_count: u64,
    /// The cycle's key; each block's records are permuted under a key drawn
    /// from it and the block number.
    key: u64,

    fn init(seed: u64, cycle: u64, blocks: *const Blocks) Layout {
        const count = blocks.group_count;
        assert(count >= 1 and count <= groups_max and blocks.per_block >= 1);
        const scratch = blocks.scratch[0..scratchCount(count)];
        const firsts = scratch[0..count];
        const ends = scratch[count..][0 .. count + 1];
        const key = mix(mix(seed ^ domain_block) +% cycle *% gamma_step);
        permuteRange(count, mix(key ^ domain_block_groups), 0, firsts);
        var total: u64 = 0;
        ends[0] = 0;
        for (firsts, ends[1..]) |*first, *end| {
            const group = first.*;
            first.* = blocks.starts[group];
            total += blocks.starts[group + 1] - blocks.starts[group];
            end.* = total;
        }
        assert(ends[count] == blocks.starts[count]);
        return .{
            .firsts = firsts,
            .ends = ends,
            .per_block = blocks.per_block,
            .block_count = std.math.divCeil(u64, count, blocks.per_block) catch unreachable,
            .key = key,
        };
    }

    /// Block b's first position; block_count gives the length.
    fn blockStart(layout: *const Layout, block: u64) u64 {
        assert(block <= layout.block_count);
        if (block == layout.block_count) return layout.ends[layout.firsts.len];
        return layout.ends[block * layout.per_block];
    }

    /// Cycle positions offset.. into target: each run of positions inside
    /// one block is one permuted range of the block, then each record is
    /// placed in its group by bisection over the block's slots.
    fn fill(layout: *const Layout, offset: u64, target: []u64) void {
        var block = lastAtMost(layout.ends, layout.per_block, layout.block_count, offset);
        var position = offset;
        var done: usize = 0;
        while (done < target.len) : (block += 1) {
            const low = layout.blockStart(block);
            const high = layout.blockStart(block + 1);
            assert(low <= position and position < high);
            const run = target[done..][0..@min(target.len - done, high - position)];
            permuteRange(high - low, mix(layout.key +% (block + 1) *% gamma), position - low, run);
            const first_slot = block * layout.per_block;
            const slot_count = @min(layout.per_block, layout.firsts.len - first_slot);
            const ends = layout.ends[first_slot..][0..slot_count];
            const firsts = layout.firsts[first_slot..][0..slot_count];
            for (run) |*slot| {
                const at = low + slot.*;
                const group = lastAtMost(ends, 1, slot_count, at);
                slot.* = firsts[group] + (at - ends[group]);
            }
            position += run.len;
            done += run.len;
        }
        assert(position == offset + target.len);
    }
};

/// The largest i in 0..count with values[i * stride] <= value, for values
/// increasing along the stride with values[0] <= value.
fn lastAtMost(values: []const u64, stride: u64, count: u64, value: u64) u64 {
    assert(count >= 1 and values[0] <= value);
    var low: u64 = 0;
    var high: u64 = count;
    while (high - low > 1) {
        const middle = low + (high - low) / 2;
        if (values[middle * stride] <= value) low = middle else high = middle;
    }
    return low;
}

// ---- the generator ----------------------------------------------------------

/// The golden-ratio increment of SplitMix64: odd, so the counter visits all
/// of 2^64 before repeating.
const gamma: u64 = 0x9e37_79b9_7f4a_7c15;
/// A second odd constant that spreads steps and cycles apart before they are
/// mixed, so the keys of neighbouring steps come from unrelated inputs.
const gamma_step: u64 = 0xd1b5_4a32_d192_ed03;
/// Domain separation: the same seed gives unrelated streams per purpose.
const domain_iid: u64 = 0x6a09_e667_f3bc_c908;
const domain_cyclic: u64 = 0xbb67_ae85_84ca_a73b;
const domain_retry: u64 = 0x3c6e_f372_fe94_f82b;
const domain_block: u64 = 0xa54f_f53a_5f1d_36f1;
const domain_block_groups: u64 = 0x510e_527f_ade6_82d1;

/// The SplitMix64 finalizer (Stafford's mix 13): a bijection of u64 whose
/// outputs for consecutive inputs pass BigCrush.
fn mix(value: u64) u64 {
    return mixLanes(1, .{value})[0];
}

/// `mix` of n values at once (the IID vector loop).
fn mixLanes(comptime n: comptime_int, value: @Vector(n, u64)) @Vector(n, u64) {
    var z = value;
    z = (z ^ (z >> @splat(30))) *% @as(@Vector(n, u64), @splat(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> @splat(27))) *% @as(@Vector(n, u64), @splat(0x94d0_49bb_1331_11eb));
    return z ^ (z >> @splat(31));
}

/// An unbiased draw from 0..length (Lemire, "Fast random integer generation
/// in an interval", 2019): the high word of random * length, rejecting the
/// `2^64 mod length` low words that would make some results more likely.
fn bounded(random: u64, length: u64) u64 {
    assert(length >= 1);
    const product = @as(u128, random) * length;
    if (@as(u64, @truncate(product)) < length) {
        @branchHint(.unlikely);
        return boundedSlow(random, length);
    }
    return @intCast(product >> 64);
}

/// Each retry is rejected with probability `(2^64 mod length) / 2^64 < 1/2`,
/// so 128 retries all fail with probability below 2^-128; only then is the
/// last (then negligibly biased) draw kept, to bound the loop.
const retries_max = 128;

fn boundedSlow(random: u64, length: u64) u64 {
    const threshold = (0 -% length) % length;
    var candidate = random;
    var product = @as(u128, candidate) * length;
    for (0..retries_max) |_| {
        if (@as(u64, @truncate(product)) >= threshold) break;
        // A pure function of the rejected draw keeps the batch a pure
        // function of (seed, step).
        candidate = mix(candidate ^ domain_retry);
        product = @as(u128, candidate) * length;
    }
    return @intCast(product >> 64);
}

// ---- the permutation -----------------------------------------------------------

/// A keyed bijection of 0..length; the image of any position is computed on
/// its own, so any batch of a cycle costs the same.
///
/// Positions split into a high part in 0..radix_high and a low part of
/// bits_low bits, bits_low = ceil(bits / 2) for length <= 2^bits. The domain
/// radix_high * 2^bits_low is then less than length + 2^bits_low: fewer
/// than one position in about sqrt(length) / 2 lands outside 0..length and
/// needs cycle-walking, so every length costs about the same. (A power-of-two domain
/// would walk up to half of all positions for lengths just above a power
/// of two, several times slower.)
///
/// The rounds alternate: even rounds add a keyed hash of the low part to the
/// high part modulo radix_high, odd rounds xor a keyed hash of the high part
/// into the low part. Each round is invertible whatever the hash, so the
/// whole is a bijection of the domain; four rounds of random-looking round
/// functions make a pseudo-random permutation (Luby-Rackoff). Lengths below
/// 2^16 get eight: with halves of 8 bits or fewer, four rounds leave pairs of
/// positions measurably dependent.
/// Both parts fit a u32, so `fill` runs 16 positions at a time in 32-bit
/// vector lanes.
const Permutation = struct {
    length: u64,
    radix_high: u32,
    bits_low: u6,
    mask_low: u64,
    /// 32 - bits_low: odd rounds keep the top bits of their hash.
    shift_low: u5,
    /// Even, so a pair of rounds is the unit of work.
    rounds: u32,
    keys: [rounds_max]u32,

    const rounds_max = 8;
    /// Positions per vector: a zmm register of u32 halves with AVX-512;
    /// narrower units split it, and the extra independent work still hides
    /// the multiply latency (faster than 8 lanes on AVX2 and SSE2 too).
    const lanes = 16;
    const Wide = @Vector(lanes, u64);

    fn init(length: u64, key: u64) Permutation {
        assert(length > shuffle_length_max and length <= length_max);
        const bits = std.math.log2_int_ceil(u64, length);
        const bits_low: u6 = @intCast((bits + 1) / 2);
        assert(bits_low >= 1 and bits_low <= 32);
        const radix_high = std.math.divCeil(u64, length, @as(u64, 1) << bits_low) catch unreachable;
        assert(radix_high >= 1 and radix_high <= 1 << 31);
        assert(radix_high << bits_low >= length);

        var keys: [rounds_max]u32 = undefined;
        for (&keys, 1..) |*round_key, round| {
            round_key.* = @truncate(mix(key +% round *% gamma) >> 32);
        }
        return .{
            .length = length,
            .radix_high = @intCast(radix_high),
            .bits_low = bits_low,
            .mask_low = (@as(u64, 1) << bits_low) - 1,
            .shift_low = @intCast(32 - @as(u7, bits_low)),
            .rounds = if (bits < 16) 8 else 4,
            .keys = keys,
        };
    }

    /// Writes the images of positions offset.. into target.
    fn fill(permutation: *const Permutation, offset: u64, target: []u64) void {
        assert(offset + target.len <= permutation.length);
        const length: Wide = @splat(permutation.length);
        var done: usize = 0;
        while (done + lanes <= target.len) : (done += lanes) {
            const positions = @as(Wide, @splat(offset + done)) + std.simd.iota(u64, lanes);
            const indices = permutation.encrypt(lanes, positions);
            target[done..][0..lanes].* = indices;
            if (@reduce(.Or, indices >= length)) {
                // Rare: each lane lands outside with probability below
                // 2^bits_low / length, about 2 / sqrt(length).
                @branchHint(.unlikely);
                for (target[done..][0..lanes]) |*slot| slot.* = permutation.walk(slot.*);
            }
        }
        for (target[done..], offset + done..) |*slot, position| {
            slot.* = permutation.apply(position);
        }
    }

    fn apply(permutation: *const Permutation, position: u64) u64 {
        assert(position < permutation.length);
        return permutation.walk(permutation.encrypt(1, .{position})[0]);
    }

    /// Cycle-walking: a point outside 0..length is encrypted again until it
    /// lands inside. The domain permutation's cycle through the original
    /// position returns to that position, so the walk ends; each step lands
    /// outside again with probability below 2^bits_low / length.
    fn walk(permutation: *const Permutation, image: u64) u64 {
        var index = image;
        while (index >= permutation.length) index = permutation.encrypt(1, .{index})[0];
        return index;
    }

    /// One pass of the network over the domain, for n positions at once.
    fn encrypt(
        permutation: *const Permutation,
        comptime n: comptime_int,
        values: @Vector(n, u64),
    ) @Vector(n, u64) {
        const Half = @Vector(n, u32);
        const radix: Half = @splat(permutation.radix_high);
        var high: Half = narrow(n, values >> @splat(permutation.bits_low));
        var low: Half = narrow(n, values & @as(@Vector(n, u64), @splat(permutation.mask_low)));
        assert(@reduce(.And, high < radix));
        var round: u32 = 0;
        while (round < permutation.rounds) : (round += 2) {
            high += reduce(n, roundHash(n, low, permutation.keys[round]), radix);
            high = @select(u32, high >= radix, high -% radix, high);
            low ^= roundHash(n, high, permutation.keys[round + 1]) >> @splat(permutation.shift_low);
        }
        return (widen(n, high) << @splat(permutation.bits_low)) | widen(n, low);
    }

    /// The inverse of `encrypt`, for the tests: the rounds undone in reverse.
    fn decrypt(permutation: *const Permutation, value: u64) u64 {
        var high: u32 = @intCast(value >> permutation.bits_low);
        var low: u32 = @intCast(value & permutation.mask_low);
        var round: u32 = permutation.rounds;
        while (round > 0) : (round -= 2) {
            low ^= roundHash(1, .{high}, permutation.keys[round - 1])[0] >> permutation.shift_low;
            const step = reduce(
                1,
                roundHash(1, .{low}, permutation.keys[round - 2]),
                .{permutation.radix_high},
            )[0];
            high = if (high >= step) high - step else high + permutation.radix_high - step;
        }
        return (@as(u64, high) << permutation.bits_low) | low;
    }
};

/// Lanes below 2^32 as u32 lanes, in an order of `narrow`'s choosing that
/// `widen` undoes. The rounds treat every lane alike, so the order is free:
/// lane i of the first half and lane i of the second share a u64 lane, which
/// takes shifts alone, where keeping the order takes cross-lane shuffles
/// (slow on some CPUs and tuned differently per CPU model).
fn narrow(comptime n: comptime_int, values: @Vector(n, u64)) @Vector(n, u32) {
    if (n % 2 != 0) return @intCast(values);
    assert(@reduce(.And, values <= @as(@Vector(n, u64), @splat(std.math.maxInt(u32)))));
    const first = std.simd.extract(values, 0, n / 2);
    const second = std.simd.extract(values, n / 2, n / 2);
    return @bitCast(first | (second << @splat(32)));
}

/// The inverse of `narrow`.
fn widen(comptime n: comptime_int, halves: @Vector(n, u32)) @Vector(n, u64) {
    if (n % 2 != 0) return halves;
    const pairs: @Vector(n / 2, u64) = @bitCast(halves);
    return std.simd.join(
        pairs & @as(@Vector(n / 2, u64), @splat(0xffff_ffff)),
        pairs >> @splat(32),
    );
}

/// Maps a 32-bit hash into 0..radix by multiply-shift; the slight unevenness
/// (radix / 2^32 at most) only shapes the round function, never the
/// bijection.
fn reduce(comptime n: comptime_int, hash: @Vector(n, u32), radix: @Vector(n, u32)) @Vector(n, u32) {
    if (!x86_avx2 or n % 2 != 0) {
        const product = @as(@Vector(n, u64), hash) * @as(@Vector(n, u64), radix);
        return @intCast(product >> @splat(32));
    }
    // The same high words without widening: each u64 lane holds two u32
    // lanes, and `vpmuludq` multiplies the lower halves into 64 bits. The
    // widened form instead narrows its products with cross-lane shuffles,
    // whose cost differs between CPU models (x86-64-v3 code tuned for Intel
    // ran the CYCLIC sampler 5-10% slower on Zen 3 than native code).
    const Pairs = @Vector(n / 2, u64);
    const low_halves: Pairs = @splat(0xffff_ffff);
    const hash_pairs: Pairs = @bitCast(hash);
    const radix_pairs: Pairs = @bitCast(radix);
    const lower = (hash_pairs & low_halves) * (radix_pairs & low_halves);
    const upper = (hash_pairs >> @splat(32)) * (radix_pairs >> @splat(32));
    return @bitCast((lower >> @splat(32)) | (upper & ~low_halves));
}

/// A round function: the keyed half through two multiply-xorshift steps
/// (the core of Wellons' lowbias32). A lone multiply is not enough: four
/// such rounds leave neighbouring positions visibly correlated.
fn roundHash(comptime n: comptime_int, half: @Vector(n, u32), key: u32) @Vector(n, u32) {
    var x = half ^ @as(@Vector(n, u32), @splat(key));
    x *%= @splat(0x7feb_352d);
    x ^= x >> @splat(15);
    x *%= @splat(0x846c_a68b);
    return x;
}

// ---- tests -----------------------------------------------------------------------

const testing = std.testing;

fn testConfig(mode: Mode, length: u64, batch_size: u64) Config {
    return .{
        .length = length,
        .batch_size = batch_size,
        .seed = 42,
        .rank = 0,
        .world_size = 1,
        .mode = @intFromEnum(mode),
        .reserved = 0,
    };
}

test "validate rejects every config that batch cannot serve, saying why" {
    var good = testConfig(.cyclic, 100, 10);
    good.world_size = 2;
    try validate(&good);

    const Case = struct { field: []const u8, value: u64, words: []const u8 };
    const cases = [_]Case{
        .{ .field = "mode", .value = 4, .words = "mode 4 is unknown" },
        .{ .field = "reserved", .value = 1, .words = "reserved" },
        .{ .field = "length", .value = 0, .words = "length is 0" },
        .{ .field = "length", .value = length_max + 1, .words = "above 2^63" },
        .{ .field = "batch_size", .value = 0, .words = "batch_size is 0" },
        .{ .field = "world_size", .value = 0, .words = "world_size is 0" },
        .{ .field = "rank", .value = 2, .words = "rank 2 is outside 0..2" },
        .{ .field = "batch_size", .value = 1 << 63, .words = "overflows 64 bits" },
        .{ .field = "batch_size", .value = 51, .words = "CYCLIC" },
    };
    inline for (cases) |case| {
        var bad = good;
        @field(bad, case.field) = @intCast(case.value);
        status.clear();
        try testing.expectError(error.InvalidArgument, validate(&bad));
        try testing.expect(std.mem.indexOf(u8, status.message(), case.words) != null);
    }
}

test "sequential batches slide over the index space and wrap around its end" {
    const config = testConfig(.sequential, 10, 4);
    var target: [4]u64 = undefined;
    batch(&config, 0, &target);
    try testing.expectEqualSlices(u64, &.{ 0, 1, 2, 3 }, &target);
    batch(&config, 2, &target);
    try testing.expectEqualSlices(u64, &.{ 8, 9, 0, 1 }, &target);
    batch(&config, 3, &target);
    try testing.expectEqualSlices(u64, &.{ 2, 3, 4, 5 }, &target);
}

test "sequential positions are exact at the largest step and global batch" {
    // G = 2^64 - 2^32 and step = 2^64 - 1: step * G needs 128 bits.
    var config = testConfig(.sequential, length_max - 1, 1 << 32);
    config.world_size = (1 << 32) - 1;
    config.rank = config.world_size - 1;
    try validate(&config);
    const step = std.math.maxInt(u64);
    const position = @as(u128, step) * config.globalBatchSize() + config.rank * config.batch_size;
    const expected: u64 = @intCast(position % config.length);
    // Only the first few slots: the loop after the start is plain counting.
    var target: [3]u64 = undefined;
    batchSequential(&config, step, &target);
    try testing.expectEqualSlices(u64, &.{ expected, expected + 1, expected + 2 }, &target);
}

test "iid batches are a pure function of (seed, step) and stay in range" {
    const config = testConfig(.iid, 1000, 64);
    var first: [64]u64 = undefined;
    var again: [64]u64 = undefined;
    var next: [64]u64 = undefined;
    batch(&config, 7, &first);
    batch(&config, 8, &next);
    batch(&config, 7, &again);
    try testing.expectEqualSlices(u64, &first, &again);
    try testing.expect(!std.mem.eql(u64, &first, &next));
    for (first) |index| try testing.expect(index < config.length);

    var reseeded = config;
    reseeded.seed = 43;
    batch(&reseeded, 7, &again);
    try testing.expect(!std.mem.eql(u64, &first, &again));
}

test "iid draws are the same in the vector loop and the scalar one, rejections included" {
    // Draw j of a batch is bounded(mix(start + (first + j + 1) * gamma)),
    // one at a time. At 3 * 2^61 a quarter of the draws take the slow path
    // of `bounded`; 2^40 + 1 needs the whole 128-bit product; batch sizes
    // around multiples of the lanes leave every tail length.
    for ([_]u64{ 1, 1000, 3 << 61, (1 << 40) + 1, length_max }) |length| {
        for ([_]u64{ 1, 7, 8, 9, 63, 64, 65 }) |batch_size| {
            var config = testConfig(.iid, length, batch_size);
            config.rank = 1;
            config.world_size = 2;
            for ([_]u64{ 0, 1, 1 << 40 }) |step| {
                var target: [65]u64 = undefined;
                batch(&config, step, target[0..batch_size]);
                const start = mix(mix(config.seed ^ domain_iid) +% step *% gamma_step);
                for (target[0..batch_size], batch_size + 1..) |index, draw| {
                    try testing.expectEqual(bounded(mix(start +% draw *% gamma), length), index);
                }
            }
        }
    }
}

test "bounded draws have no modulo bias on a length of 3 * 2^61" {
    // Unbiased, an index is below 2^62 with probability 2/3 and is 2 mod 3
    // with probability 1/3. `x mod length` folds the top quarter of u64 onto
    // 0..2^62 (probability 1/2); multiply-shift without rejection maps 3 of
    // every 8 words to indices 0 and 1 mod 3 but only 2 to index 2 mod 3
    // (probability 1/4). Both would fail here by more than 20 sigma.
    const length: u64 = 3 << 61;
    const draws = 30_000;
    var below: u64 = 0;
    var two_mod_three: u64 = 0;
    var rejected: u64 = 0;
    for (0..draws) |i| {
        const random = mix(i);
        if (@as(u64, @truncate(@as(u128, random) * length)) < (0 -% length) % length) rejected += 1;
        const index = bounded(random, length);
        try testing.expect(index < length);
        if (index < 1 << 62) below += 1;
        if (index % 3 == 2) two_mod_three += 1;
    }
    // Expected 20_000 and 10_000, standard deviation about 82; a quarter of
    // the raw draws land in the rejection zone, so the slow path ran.
    try testing.expect(below > 19_500 and below < 20_500);
    try testing.expect(two_mod_three > 9_500 and two_mod_three < 10_500);
    try testing.expect(rejected > 7_000 and rejected < 8_000);
}

fn expectPermutation(indices: []const u64) !void {
    var seen = try std.DynamicBitSet.initEmpty(testing.allocator, indices.len);
    defer seen.deinit();
    for (indices) |index| {
        try testing.expect(index < indices.len);
        try testing.expect(!seen.isSet(index));
        seen.set(index);
    }
}

test "the permutation is a bijection of 0..length, vector and scalar paths alike" {
    const lengths = [_]u64{ 257, 1000, 4096, 4097, 32_769, 65_535, 65_537, 100_003 };
    for (lengths) |length| {
        const indices = try testing.allocator.alloc(u64, length);
        defer testing.allocator.free(indices);
        const permutation = Permutation.init(length, mix(length));
        permutation.fill(0, indices);
        try expectPermutation(indices);
        // A fill from an odd offset runs other positions through the tail.
        permutation.fill(5, indices[5..]);
        for (indices, 0..) |index, position| {
            try testing.expectEqual(permutation.apply(position), index);
        }
    }
}

test "decrypt undoes encrypt over the whole domain, up to 2^63" {
    const lengths = [_]u64{ 257, 1 << 20, (1 << 40) + 1, length_max };
    for (lengths) |length| {
        const permutation = Permutation.init(length, mix(length));
        const domain = @as(u64, permutation.radix_high) << permutation.bits_low;
        try testing.expect(
            domain >= length and domain - length < @as(u64, 1) << permutation.bits_low,
        );
        for (0..1000) |i| {
            const value = mix(i) % domain;
            const encrypted = permutation.encrypt(1, .{value})[0];
            try testing.expect(encrypted < domain);
            try testing.expectEqual(value, permutation.decrypt(encrypted));
            try testing.expect(permutation.apply(value % length) < length);
        }
    }
}

test "reduce gives the high word of hash * radix in every lane, paired or not" {
    // AVX2 builds take the paired form for 16 lanes and the widened one for
    // a single lane; both must equal the plain 64-bit product's high word.
    // Each lane's radix is shifted further right, down to a few bits.
    var hashes: [16]u32 = undefined;
    var radixes: [16]u32 = undefined;
    for (0..1000) |i| {
        for (&hashes, &radixes, 0..) |*hash, *radix, lane| {
            const random = mix(i * 16 + lane);
            hash.* = @truncate(random);
            radix.* = @max(1, @as(u32, @truncate(random >> 32)) >> @intCast(lane));
        }
        const paired = reduce(16, hashes, radixes);
        for (hashes, radixes, 0..) |hash, radix, lane| {
            const expected: u32 = @intCast((@as(u64, hash) * radix) >> 32);
            try testing.expectEqual(expected, paired[lane]);
            try testing.expectEqual(expected, reduce(1, .{hash}, .{radix})[0]);
        }
    }
}

test "cyclic lengths up to 256 are exact shuffles, one per cycle" {
    for ([_]u64{ 1, 2, 3, 5, 16, 100, 255, 256 }) |length| {
        const config = testConfig(.cyclic, length, length);
        var first: [shuffle_length_max]u64 = undefined;
        var second: [shuffle_length_max]u64 = undefined;
        batch(&config, 0, first[0..length]);
        batch(&config, 1, second[0..length]);
        try expectPermutation(first[0..length]);
        try expectPermutation(second[0..length]);
        if (length >= 16) try testing.expect(
            !std.mem.eql(u64, first[0..length], second[0..length]),
        );
    }
}

test "each cyclic cycle visits distinct indices and differs from the last" {
    const length = 1000;
    const config = testConfig(.cyclic, length, 64);
    // 1000 = 15 * 64 + 40: each cycle serves 15 batches and drops 40 indices.
    const batches_per_cycle = 15;
    var cycles: [2][batches_per_cycle * 64]u64 = undefined;
    for (&cycles, 0..) |*cycle, c| {
        var seen = try std.DynamicBitSet.initEmpty(testing.allocator, length);
        defer seen.deinit();
        for (0..batches_per_cycle) |b| {
            const target = cycle[b * 64 ..][0..64];
            batch(&config, c * batches_per_cycle + b, target);
            for (target) |index| {
                try testing.expect(!seen.isSet(index));
                seen.set(index);
            }
        }
    }
    try testing.expect(!std.mem.eql(u64, &cycles[0], &cycles[1]));
}

test "the ranks' batches concatenate to the global batch in every mode" {
    const world_size = 3;
    const share = 5;
    // 97 takes the exact shuffle in cyclic mode, 1001 the Feistel network.
    for ([_]Mode{ .sequential, .iid, .cyclic }) |mode| for ([_]u64{ 97, 1001 }) |length| {
        const global = testConfig(mode, length, share * world_size);
        for ([_]u64{ 0, 1, 6, 7, 1 << 40 }) |step| {
            var expected: [share * world_size]u64 = undefined;
            batch(&global, step, &expected);
            for (0..world_size) |rank| {
                var config = testConfig(mode, length, share);
                config.rank = rank;
                config.world_size = world_size;
                var target: [share]u64 = undefined;
                batch(&config, step, &target);
                try testing.expectEqualSlices(u64, expected[rank * share ..][0..share], &target);
            }
        }
    };
}

/// A BLOCK config and its groups over `rows`, with scratch, for the tests.
const TestBlocks = struct {
    config: Config,
    starts: [65]u64,
    scratch: [2 * 64 + 1]u64,
    count: u64,
    per_block: u64,

    fn init(rows: []const u64, per_block: u64, batch_size: u64) TestBlocks {
        assert(rows.len <= 64);
        var self: TestBlocks = undefined;
        self.starts[0] = 0;
        for (rows, 0..) |count, group| self.starts[group + 1] = self.starts[group] + count;
        self.count = rows.len;
        self.per_block = per_block;
        self.config = testConfig(.block, self.starts[rows.len], batch_size);
        return self;
    }

    fn blocks(self: *TestBlocks) Blocks {
        return .{
            .starts = &self.starts,
            .group_count = self.count,
            .per_block = self.per_block,
            .scratch = &self.scratch,
            .scratch_count = self.scratch.len,
        };
    }

    fn batch(self: *TestBlocks, step: u64, target: []u64) !void {
        const groups = self.blocks();
        try validateBlocks(&self.config, &groups);
        batchBlock(&self.config, &groups, step, target);
    }

    /// The group holding index.
    fn groupOf(self: *const TestBlocks, index: u64) u64 {
        return lastAtMost(self.starts[0 .. self.count + 1], 1, self.count, index);
    }
};

test "validateBlocks rejects groups that batchBlock cannot serve, saying why" {
    var cases = TestBlocks.init(&.{ 3, 4, 5 }, 2, 4);
    var groups = cases.blocks();
    try validateBlocks(&cases.config, &groups);

    const cyclic = testConfig(.cyclic, 12, 4);
    status.clear();
    try testing.expectError(error.InvalidArgument, validateBlocks(&cyclic, &groups));
    try testing.expect(std.mem.indexOf(u8, status.message(), "mode is 2") != null);

    const Case = struct { field: []const u8, value: u64, words: []const u8 };
    const cases_bad = [_]Case{
        .{ .field = "group_count", .value = 0, .words = "1..1048576 groups, got 0" },
        .{ .field = "per_block", .value = 0, .words = "shards_per_block is 0" },
        .{ .field = "scratch_count", .value = 6, .words = "need 2 * groups + 1 = 7" },
        .{ .field = "group_count", .value = 2, .words = "not from 0 to the sampler length 12" },
    };
    inline for (cases_bad) |case| {
        var bad = groups;
        @field(bad, case.field) = case.value;
        status.clear();
        try testing.expect(std.meta.isError(validateBlocks(&cases.config, &bad)));
        try testing.expect(std.mem.indexOf(u8, status.message(), case.words) != null);
    }
    cases.starts[2] = cases.starts[1];
    status.clear();
    try testing.expectError(error.InvalidArgument, validateBlocks(&cases.config, &groups));
    try testing.expect(std.mem.indexOf(u8, status.message(), "group 1 holds no rows") != null);
}

/// Group sizes for the block tests: tiny and single-row groups, groups
/// above the exact-shuffle length (the Feistel path inside a block), and
/// more than 256 records per block.
const test_rows = [_]u64{ 1, 7, 300, 1, 1, 40, 129, 5, 2, 600, 1, 33, 17 };

test "each block cycle is a permutation of all records, different every cycle" {
    for ([_]u64{ 1, 2, 3, 4, 13, 50 }) |per_block| {
        var cases = TestBlocks.init(&test_rows, per_block, 1);
        const length = cases.config.length;
        cases.config.batch_size = length; // one batch per cycle: the whole cycle
        var first: [1137]u64 = undefined;
        var second: [1137]u64 = undefined;
        try testing.expectEqual(length, first.len);
        try cases.batch(0, &first);
        try cases.batch(1, &second);
        try expectPermutation(&first);
        try expectPermutation(&second);
        try testing.expect(!std.mem.eql(u64, &first, &second));
    }
}

test "a block's records come only from its groups, and each block is whole" {
    for ([_]u64{ 1, 2, 3, 5 }) |per_block| {
        var cases = TestBlocks.init(&test_rows, per_block, 1137);
        var stream: [1137]u64 = undefined;
        try cases.batch(3, &stream);
        var groups = cases.blocks();
        const layout = Layout.init(cases.config.seed, 3, &groups);
        try testing.expectEqual((test_rows.len + per_block - 1) / per_block, layout.block_count);
        for (0..layout.block_count) |block| {
            const low = layout.blockStart(block);
            const high = layout.blockStart(block + 1);
            // The block's groups, by their first index.
            const slots = layout.firsts[block * per_block ..][0..@min(
                per_block,
                test_rows.len - block * per_block,
            )];
            var rows: u64 = 0;
            for (slots) |first| rows += test_rows[cases.groupOf(first)];
            try testing.expectEqual(rows, high - low);
            for (stream[low..high]) |index| {
                const first = cases.starts[cases.groupOf(index)];
                try testing.expect(std.mem.indexOfScalar(u64, slots, first) != null);
            }
        }
    }
}

test "block batches are a pure function of (seed, step), whatever the batch size" {
    var whole = TestBlocks.init(&test_rows, 3, 1137);
    var stream: [1137]u64 = undefined;
    try whole.batch(2, &stream);
    // Batches of 10 read the same cycle 2 in order; the last 7 are dropped.
    var cases = TestBlocks.init(&test_rows, 3, 10);
    for (0..113) |b| {
        var target: [10]u64 = undefined;
        try cases.batch(2 * 113 + b, &target);
        try testing.expectEqualSlices(u64, stream[b * 10 ..][0..10], &target);
        var again: [10]u64 = undefined;
        try cases.batch(2 * 113 + b, &again);
        try testing.expectEqualSlices(u64, &target, &again);
    }
    var reseeded = whole;
    reseeded.config.seed = 43;
    var other: [1137]u64 = undefined;
    try reseeded.batch(2, &other);
    try testing.expect(!std.mem.eql(u64, &stream, &other));
}

test "block edge cases: one group, single-row groups, a block of all groups" {
    var target: [64]u64 = undefined;
    // One group: every block order is a permutation of the group.
    var one = TestBlocks.init(&.{64}, 2, 64);
    try one.batch(0, &target);
    try expectPermutation(&target);
    // Single-row groups, one per block: the stream is the group order itself.
    const singles = [_]u64{1} ** 64;
    var single = TestBlocks.init(&singles, 1, 64);
    try single.batch(5, &target);
    try expectPermutation(&target);
    var groups = single.blocks();
    const layout = Layout.init(single.config.seed, 5, &groups);
    try testing.expectEqualSlices(u64, layout.firsts, &target);
    // per_block at or above the group count: one block, all of it.
    for ([_]u64{ 64, 65, std.math.maxInt(u64) }) |per_block| {
        var all = TestBlocks.init(&singles, per_block, 64);
        try all.batch(0, &target);
        try expectPermutation(&target);
        var all_groups = all.blocks();
        try testing.expectEqual(1, Layout.init(all.config.seed, 0, &all_groups).block_count);
    }
}

test "block positions read any run of a cycle, as the batches do" {
    var whole = TestBlocks.init(&test_rows, 2, 1137);
    var stream: [1137]u64 = undefined;
    try whole.batch(6, &stream);
    var groups = whole.blocks();
    for ([_]u64{ 0, 1, 299, 300, 1000, 1130 }) |offset| {
        var target: [7]u64 = undefined;
        positionsBlock(&whole.config, &groups, 6, offset, &target);
        try testing.expectEqualSlices(u64, stream[offset..][0..7], &target);
    }
    positionsBlock(&whole.config, &groups, 6, 1137, &.{});
}

test "the ranks' block batches concatenate to the global batch" {
    const world_size = 3;
    const share = 7;
    var global = TestBlocks.init(&test_rows, 2, share * world_size);
    for ([_]u64{ 0, 1, 53, 54, 1 << 40 }) |step| {
        var expected: [share * world_size]u64 = undefined;
        try global.batch(step, &expected);
        for (0..world_size) |rank| {
            var cases = TestBlocks.init(&test_rows, 2, share);
            cases.config.rank = rank;
            cases.config.world_size = world_size;
            var target: [share]u64 = undefined;
            try cases.batch(step, &target);
            try testing.expectEqualSlices(u64, expected[rank * share ..][0..share], &target);
        }
    }
}
