//! The power-loss and fault simulation of zrecord. A seeded generator makes
//! workloads of mixed operations (appends in both layouts and every codec,
//! replaces, deletes in both orders, compaction, dictionary training, the
//! fixed-to-indexed change, sync, reopen) and runs them against an in-memory
//! model, on the simulated disk of storage.zig:
//!
//!   power loss   at every counted I/O call of short workloads, and with
//!                several seeds for what the lost writes leave. After each,
//!                the store must reopen at the state after the last
//!                acknowledged operation or after the one in flight (every
//!                commit is durable when it returns), read back byte-exact
//!                with checksums verified, `verify()` must find nothing, and
//!                the next writer's recovery must leave no orphan file.
//!   faults       EIO, ENOSPC, a short write and a failed sync at every call
//!                of every kind. The failing operation must return an error
//!                with a message, leave the committed state as it was, and
//!                the store must work again once the fault clears (after a
//!                reopen when a sync failed: the writer refuses until then).
//!
//! Scale: LOADERX_SIM_SCALE (default 1, the CI size) multiplies the number
//! of workloads; LOADERX_SIM_SEED replays one workload seed; the counts go to
//! the file LOADERX_SIM_REPORT names, for the Python test to check.
const std = @import("std");
const storage = @import("storage.zig");
const io = @import("../io.zig");
const store_module = @import("../store.zig");
const format = @import("../format.zig");
const status = @import("../status.zig");
const undo = @import("../undo.zig");

const Store = store_module.Store;
const Codec = format.Codec;
const testing = std.testing;
const assert = std.debug.assert;
const gpa = std.heap.c_allocator;

/// One arena for every run, emptied between runs but keeping its memory.
var run_arena = std.heap.ArenaAllocator.init(gpa);

fn freshArena() std.mem.Allocator {
    _ = run_arena.reset(.retain_capacity);
    return run_arena.allocator();
}

const path = "sim/store";
/// How the workload running now opens its store (durable=False for every
/// third and fourth seed of four).
var workload_durable = true;
const fixed_record_bytes = 1000;
const dictionary_bytes = 256;

// ---- the model ---------------------------------------------------------------

/// The store's records as the operations acknowledged so far define them.
const Model = struct {
    records: std.ArrayList([]const u8) = .empty,

    fn clone(model: *const Model, arena: std.mem.Allocator) !Model {
        var copy = Model{};
        try copy.records.appendSlice(arena, model.records.items);
        return copy;
    }

    fn apply(model: *Model, arena: std.mem.Allocator, operation: Operation) !void {
        switch (operation) {
            .append => |append| try model.records.appendSlice(arena, append.records),
            .replace => |replace| for (replace.indices, replace.records) |index, record| {
                model.records.items[index] = record;
            },
            .delete => |removal| try model.remove(arena, removal.indices, removal.keep_order),
            .compact, .train_dict, .sync, .reopen => {},
        }
    }

    /// Order-keeping removal, or the store's tail-fills-the-holes rule.
    fn remove(
        model: *Model,
        arena: std.mem.Allocator,
        indices: []const u64,
        keep_order: bool,
    ) !void {
        const old = model.records.items;
        const doomed = try arena.alloc(bool, old.len);
        @memset(doomed, false);
        for (indices) |index| doomed[index] = true;
        var survivors: std.ArrayList([]const u8) = .empty;
        if (keep_order) {
            for (old, doomed) |record, gone| if (!gone) try survivors.append(arena, record);
        } else {
            var removed: usize = 0;
            for (doomed) |gone| removed += @intFromBool(gone);
            const remaining = old.len - removed;
            var tail = remaining;
            for (0..remaining) |index| {
                if (!doomed[index]) {
                    try survivors.append(arena, old[index]);
                    continue;
                }
                while (doomed[tail]) tail += 1;
                try survivors.append(arena, old[tail]);
                tail += 1;
            }
        }
        model.records = survivors;
    }
};

// ---- workloads -------------------------------------------------------------------

const Operation = union(enum) {
    append: struct { records: []const []const u8, codec: Codec },
    replace: struct { indices: []const u64, records: []const []const u8, codec: Codec },
    delete: struct { indices: []const u64, keep_order: bool },
    compact,
    train_dict,
    sync,
    reopen,
};

const Generator = struct {
    random: std.Random,
    arena: std.mem.Allocator,
    count: u64 = 0,
    dictionary: bool = false,
    /// Only fixed-length raw records: the store stays fixed, so replaces
    /// go through the journal in place.
    fixed_only: bool = false,
    /// Runs of unsynced in-place replaces across sync() boundaries (the
    /// undo area's workloads, durable=False).
    undo_runs: bool = false,
    /// The length of the fixed layout's records.
    row_bytes: usize = fixed_record_bytes,

    fn record(generator: *Generator, length: usize, compressible: bool) ![]const u8 {
        const bytes = try generator.arena.alloc(u8, length);
        if (compressible) {
            // Few distinct words: zstd shrinks it, and so does a dictionary.
            const words = [_][]const u8{
                "token ",
                "sample ",
                "label=7 ",
                "float32 ",
                "\x00\x00\x00\x01",
            };
            var at: usize = 0;
            while (at < length) {
                const word = words[generator.random.uintLessThan(usize, words.len)];
                const take = @min(word.len, length - at);
                @memcpy(bytes[at..][0..take], word[0..take]);
                at += take;
            }
        } else {
            generator.random.bytes(bytes);
        }
        return bytes;
    }

    fn records(
        generator: *Generator,
        count: usize,
        record_codec: Codec,
        fixed: bool,
    ) ![]const []const u8 {
        const list = try generator.arena.alloc([]const u8, count);
        for (list) |*item| {
            const length = if (fixed)
                generator.row_bytes
            else
                generator.random.uintAtMost(usize, 1500);
            item.* = try generator.record(length, record_codec != .raw);
        }
        return list;
    }

    fn pickCodec(generator: *Generator) Codec {
        // The dictionary codecs come last: they are picked only once a dictionary exists.
        const choices = [_]Codec{
            .raw,
            .zstd,
            .zstd_shuffle2,
            .zstd_shuffle4,
            .zstd_shuffle8,
            .zstd_dict,
            .zstd_dict_shuffle4,
        };
        const choice = generator.random.uintLessThan(
            u8,
            if (generator.dictionary) choices.len else 5,
        );
        return choices[choice];
    }

    fn indices(generator: *Generator, count: usize, unique: bool) ![]const u64 {
        const list = try generator.arena.alloc(u64, count);
        for (list, 0..) |*index, k| {
            while (true) {
                index.* = generator.random.uintLessThan(u64, generator.count);
                if (!unique or std.mem.indexOfScalar(u64, list[0..k], index.*) == null) break;
            }
        }
        return list;
    }

    /// The next operation; appends in the fixed layout dominate at first, so
    /// most workloads exercise both layouts and the change between them.
    fn next(generator: *Generator) !Operation {
        if (generator.undo_runs) return undo_operations.next(generator);
        if (generator.fixed_only) return fixed_operations.next(generator);
        const roll = generator.random.uintLessThan(u8, 100);
        if (generator.count == 0 or roll < 35) {
            const fixed = roll < 25 or generator.count == 0;
            const codec_choice: Codec = if (fixed) .raw else generator.pickCodec();
            const count = 1 + generator.random.uintLessThan(usize, 20);
            generator.count += count;
            return .{
                .append = .{
                    .records = try generator.records(count, codec_choice, fixed),
                    .codec = codec_choice,
                },
            };
        }
        if (roll < 55) {
            const count = 1 + generator.random.uintLessThan(usize, @min(generator.count, 6));
            const fixed = generator.random.boolean();
            const codec_choice: Codec = if (fixed) .raw else generator.pickCodec();
            return .{
                .replace = .{
                    .indices = try generator.indices(count, true),
                    .records = try generator.records(count, codec_choice, fixed),
                    .codec = codec_choice,
                },
            };
        }
        if (roll < 70 and generator.count > 1) {
            const count = 1 + generator.random.uintLessThan(usize, @min(generator.count - 1, 6));
            const list = try generator.indices(count, false);
            var unique = std.AutoHashMap(u64, void).init(generator.arena);
            for (list) |index| try unique.put(index, {});
            generator.count -= unique.count();
            return .{ .delete = .{ .indices = list, .keep_order = generator.random.boolean() } };
        }
        if (roll < 78) return .compact;
        if (roll < 84 and !generator.dictionary) {
            generator.dictionary = true;
            return .train_dict;
        }
        if (roll < 92) return .sync;
        return .reopen;
    }
};

const fixed_operations = struct {
    fn next(generator: *Generator) !Operation {
        const roll = generator.random.uintLessThan(u8, 100);
        if (generator.count == 0 or roll < 20) {
            const count = 1 + generator.random.uintLessThan(usize, 20);
            generator.count += count;
            return .{
                .append = .{ .records = try generator.records(count, .raw, true), .codec = .raw },
            };
        }
        if (roll < 70) {
            const count = 1 + generator.random.uintLessThan(usize, @min(generator.count, 6));
            return .{
                .replace = .{
                    .indices = try generator.indices(count, true),
                    .records = try generator.records(count, .raw, true),
                    .codec = .raw,
                },
            };
        }
        if (roll < 78 and generator.count > 1) {
            const count = 1 + generator.random.uintLessThan(usize, @min(generator.count - 1, 4));
            const list = try generator.indices(count, true);
            generator.count -= count;
            return .{ .delete = .{ .indices = list, .keep_order = generator.random.boolean() } };
        }
        if (roll < 88) return .sync;
        return .reopen;
    }
};

const undo_operations = struct {
    /// A store of a few blocks and a partial last one, then mostly replaces
    /// (single rows, scattered rows, runs across block edges) between
    /// syncs, with an append, a delete or a reopen now and then.
    fn next(generator: *Generator) !Operation {
        const roll = generator.random.uintLessThan(u8, 100);
        if (generator.count == 0 or roll < 6) {
            // A few blocks whatever the rows' width.
            const first_rows = @max(4, 33 * fixed_record_bytes / generator.row_bytes);
            const count = if (generator.count == 0)
                first_rows + generator.random.uintLessThan(usize, first_rows + 7)
            else
                1 + generator.random.uintLessThan(usize, 5);
            generator.count += count;
            return .{
                .append = .{ .records = try generator.records(count, .raw, true), .codec = .raw },
            };
        }
        if (roll < 78) {
            const run = generator.random.boolean();
            const count = 1 + generator.random.uintLessThan(
                usize,
                @min(generator.count, @as(u64, if (run) 24 else 4)),
            );
            const list = if (run) list: {
                const list = try generator.arena.alloc(u64, count);
                const first = generator.random.uintLessThan(u64, generator.count - count + 1);
                for (list, 0..) |*index, k| index.* = first + k;
                break :list list;
            } else try generator.indices(count, true);
            return .{
                .replace = .{
                    .indices = list,
                    .records = try generator.records(count, .raw, true),
                    .codec = .raw,
                },
            };
        }
        if (roll < 82 and generator.count > 2) {
            generator.count -= 1;
            const list = try generator.indices(1, true);
            return .{ .delete = .{ .indices = list, .keep_order = generator.random.boolean() } };
        }
        if (roll < 96) return .sync;
        return .reopen;
    }
};

/// Workload seeds from here on are the undo area's (`undo_operations`).
const undo_seed_base = 1_000_000;

/// Every other undo workload saves the rows of any replace that finds two
/// blocks unsaved as range records (undo.zig), so its small stores mix
/// range and block records, blocks saved by ranges and then whole.
fn rangeBlocksMin(seed: u64) u64 {
    return if (seed >= undo_seed_base and seed % 2 == 1) 2 else 64;
}

/// The last two of every six undo workloads have rows wider than a block
/// (a 40,000-byte row lies in three or four blocks, those inside it its own).
fn rowBytes(seed: u64) usize {
    const wide = seed >= undo_seed_base and (seed - undo_seed_base) % 6 >= 4;
    return if (wide) 40_000 else fixed_record_bytes;
}

/// Operations per workload: the undo area's are longer, the wide ones most.
fn workloadLength(seed: u64) usize {
    if (seed < undo_seed_base) return 10;
    return if (rowBytes(seed) > fixed_record_bytes) 20 else 14;
}

fn makeWorkload(seed: u64, length: usize, arena: std.mem.Allocator) ![]const Operation {
    var prng = std.Random.DefaultPrng.init(seed);
    // Every other workload keeps the store fixed: mostly in-place replaces,
    // with the appends, deletes, syncs and reopens that checkpoint them.
    var generator = Generator{
        .random = prng.random(),
        .arena = arena,
        .fixed_only = seed % 2 == 0,
        .undo_runs = seed >= undo_seed_base,
        .row_bytes = rowBytes(seed),
    };
    const operations = try arena.alloc(Operation, length);
    for (operations) |*operation| operation.* = try generator.next();
    return operations;
}

// ---- running a workload --------------------------------------------------------

/// Packs records back to back with their offsets, as append and replace take them.
fn pack(
    arena: std.mem.Allocator,
    records: []const []const u8,
) !struct { source: []u8, offsets: []u64 } {
    var total: usize = 0;
    for (records) |item| total += item.len;
    const source = try arena.alloc(u8, total);
    const offsets = try arena.alloc(u64, records.len);
    var at: usize = 0;
    for (records, offsets) |item, *offset| {
        offset.* = at;
        @memcpy(source[at..][0..item.len], item);
        at += item.len;
    }
    return .{ .source = source, .offsets = offsets };
}

fn trainSamples(arena: std.mem.Allocator) !struct { samples: []u8, sizes: []u64 } {
    var prng = std.Random.DefaultPrng.init(7);
    var generator = Generator{ .random = prng.random(), .arena = arena };
    const count = 64;
    const sizes = try arena.alloc(u64, count);
    var samples: std.ArrayList(u8) = .empty;
    for (sizes) |*size| {
        const item = try generator.record(64 + generator.random.uintLessThan(usize, 128), true);
        try samples.appendSlice(arena, item);
        size.* = item.len;
    }
    return .{ .samples = samples.items, .sizes = sizes };
}

/// Runs one operation against the store (which `reopen` replaces).
fn perform(store: *?*Store, operation: Operation, arena: std.mem.Allocator) status.Error!void {
    if (store.* == null) store.* = try Store.open(path, 1, true, workload_durable);
    const handle = store.*.?;
    switch (operation) {
        .append => |append| {
            const packed_records = pack(arena, append.records) catch return error.OutOfMemory;
            _ = try handle.append(packed_records.source, packed_records.offsets, append.codec);
        },
        .replace => |replace| {
            const packed_records = pack(arena, replace.records) catch return error.OutOfMemory;
            try handle.replace(
                replace.indices,
                packed_records.source,
                packed_records.offsets,
                replace.codec,
            );
        },
        .delete => |removal| try handle.delete(removal.indices, removal.keep_order),
        .compact => try handle.compact(),
        .train_dict => {
            const training = trainSamples(arena) catch return error.OutOfMemory;
            _ = try handle.trainDict(training.samples, training.sizes, dictionary_bytes);
        },
        .sync => try handle.sync(),
        .reopen => {
            handle.close();
            store.* = null;
            store.* = try Store.open(path, 1, true, workload_durable);
        },
    }
}

/// Checks that the store holds exactly `model`, every checksum holds, and a
/// writer's recovery leaves only the files the superblock names.
fn expectState(store: *Store, model: *const Model, arena: std.mem.Allocator) !void {
    try expectRecords(store, model, arena);
    const damaged = try arena.alloc(u64, store.count());
    try testing.expectEqual(@as(u64, 0), try store.verify(0, damaged.len, damaged));
    try expectNoOrphans(store, arena);
}

fn expectRecords(store: *Store, model: *const Model, arena: std.mem.Allocator) !void {
    if (!try sameRecords(store, model, arena)) {
        std.debug.print(
            "the store holds {d} records that differ from the model's {d}\n",
            .{ store.count(), model.records.items.len },
        );
        return error.TestUnexpectedResult;
    }
}

/// Whether the store holds exactly the model's records (read with checksums).
fn sameRecords(store: *Store, model: *const Model, arena: std.mem.Allocator) !bool {
    const expected = model.records.items;
    if (store.count() != expected.len) return false;
    if (expected.len == 0) return true;
    const indices = try arena.alloc(u64, expected.len);
    for (indices, 0..) |*index, k| index.* = k;
    const lengths = try arena.alloc(u64, expected.len);
    try store.lengths(indices, lengths);
    const offsets = try arena.alloc(u64, expected.len);
    var total: u64 = 0;
    for (offsets, expected, lengths) |*offset, item, length| {
        if (length != item.len) return false;
        offset.* = total;
        total += item.len;
    }
    const target = try arena.alloc(u8, total);
    try store.gather(indices, target, offsets);
    for (expected, offsets) |item, offset| {
        if (!std.mem.eql(u8, item, target[offset..][0..item.len])) return false;
    }
    return true;
}

fn expectNoOrphans(store: *Store, arena: std.mem.Allocator) !void {
    try store.sync(); // A reopened writer must not be poisoned.
    // Any write runs recovery first; a compaction of a compact store writes
    // nothing else. A durable=False store deletes replaced files at its
    // next sync.
    try store.compact();
    try store.sync();
    const superblock = store.head().superblock;
    var names: std.ArrayList([]const u8) = .empty;
    try storage.listNames(path, &names, arena);
    for (names.items) |name| {
        if (std.mem.eql(u8, name, "superblock") or std.mem.eql(u8, name, "lock") or
            std.mem.eql(u8, name, undo.file_name)) continue;
        const parsed = format.parseFileName(name) orelse {
            std.debug.print("unexpected file '{s}' in the store\n", .{name});
            return error.TestUnexpectedResult;
        };
        const named = switch (parsed.kind) {
            .data => superblock.data_file,
            .index => superblock.index_file,
            .sums => superblock.sums_file,
            .dict => superblock.dict_file,
            .journal => superblock.journal_file,
        };
        if (named != parsed.id) {
            std.debug.print("orphan file '{s}' survived recovery\n", .{name});
            return error.TestUnexpectedResult;
        }
    }
}

/// The model after each acknowledged operation: states[i] is after i of them.
fn modelStates(operations: []const Operation, arena: std.mem.Allocator) ![]Model {
    const states = try arena.alloc(Model, operations.len + 1);
    states[0] = .{};
    for (operations, 0..) |operation, k| {
        states[k + 1] = try states[k].clone(arena);
        try states[k + 1].apply(arena, operation);
    }
    return states;
}

// ---- power loss --------------------------------------------------------------------

const Counts = struct {
    power_losses: u64 = 0,
    faults: u64 = 0,
    workloads: u64 = 0,
    undo_workloads: u64 = 0,
};

/// LOADERX_SIM_BREAK=<name> breaks the undo area on purpose (undo.Sabotage):
/// the simulation must then fail.
fn sabotageFromEnv() undo.Sabotage {
    const text = std.process.getEnvVarOwned(gpa, "LOADERX_SIM_BREAK") catch return .none;
    defer gpa.free(text);
    return std.meta.stringToEnum(undo.Sabotage, text) orelse .none;
}

/// Runs `operations` with power lost before call `crash_call`, then brings
/// power back with `seed` and checks the store that survives. Returns false
/// when the workload finished before that call (nothing was lost).
fn powerLossTrial(
    operations: []const Operation,
    states: []const Model,
    crash_call: u64,
    seed: ?u64,
) !bool {
    const arena = freshArena();
    storage.reset();
    storage.trace = trace_call == crash_call;
    defer storage.trace = false;
    if (storage.trace) for (operations, 0..) |operation, k| {
        std.debug.print("operation {d}: {s}\n", .{ k, @tagName(operation) });
    };
    storage.powerOffAt(crash_call);
    var store: ?*Store = null;
    var acknowledged: usize = 0;
    for (operations) |operation| {
        perform(&store, operation, arena) catch |err| {
            if (!storage.poweredOff()) return err; // Failed with power on.
            break;
        };
        acknowledged += 1;
    }
    const lost = storage.poweredOff();
    if (store) |handle| handle.close();
    if (!lost) return false;
    // No seed: the process is killed and the machine stays up.
    if (seed) |power_seed| storage.powerLoss(power_seed) else storage.processCrash();
    const reopened = try Store.open(path, 1, true, workload_durable);
    defer reopened.close();
    // A crash cuts commits short; it never damages: no slot loses its
    // magic, and no synced generation is lost.
    if (reopened.damaged) {
        std.debug.print(
            "after power loss at call {d} (seed {?d}): reported as damage: {s}\n",
            .{ crash_call, seed, reopened.fallBackReason() },
        );
        return error.TestUnexpectedResult;
    }
    const trial = Trial{ .crash_call = crash_call, .seed = seed, .arena = arena };
    const expected = try survivingState(reopened, operations, states, acknowledged, trial);
    try expectState(reopened, expected, arena);
    return true;
}

/// Which power-loss trial runs: where the crash came, and how.
const Trial = struct { crash_call: u64, seed: ?u64, arena: std.mem.Allocator };

/// The model state the store reopened after a crash holds, or a failure
/// naming the trial. durable=True: every commit is durable when it
/// returns, so the store holds the state after the acknowledged
/// operations, or after the one in flight too. durable=False: the state at
/// the last acknowledged sync (or reopen: close syncs) or any later one,
/// whole.
fn survivingState(
    reopened: *Store,
    operations: []const Operation,
    states: []const Model,
    acknowledged: usize,
    trial: Trial,
) !*const Model {
    const arena = trial.arena;
    const crash_call = trial.crash_call;
    const seed = trial.seed;
    const in_flight = @min(acknowledged + 1, states.len - 1);
    // A killed process loses nothing the page cache holds, in either mode,
    // except durable=False in-place replaces since the interval began: the
    // undo area takes the store back to its last sync (undo.zig).
    const oldest = if (workload_durable)
        acknowledged
    else if (seed == null)
        intervalStart(operations[0..acknowledged])
    else
        lastSync(operations[0..acknowledged]);
    var candidate = in_flight + 1;
    const expected = while (candidate > oldest) {
        candidate -= 1;
        if (try sameRecords(reopened, &states[candidate], arena)) break &states[candidate];
    } else {
        std.debug.print(
            "after power loss at call {d} (seed {?d}, durable={}), {d} operations acknowledged: " ++
                "the store matches no model from state {d} (the last sync) to {d} (the " ++
                "operation in flight, {s})\n",
            .{
                crash_call,
                seed,
                workload_durable,
                acknowledged,
                oldest,
                in_flight,
                @tagName(operations[@min(acknowledged, operations.len - 1)]),
            },
        );
        return error.TestUnexpectedResult;
    };
    return expected;
}

/// LOADERX_SIM_TRACE=n prints every I/O call of the power-loss trials that
/// cut power at call n (with LOADERX_SIM_SEED, to see one failure whole).
var trace_call: ?u64 = null;

/// In a durable=False store, the number of operations before the first
/// replace that no commit followed (a replace in place saves blocks in the
/// undo area; every other operation commits durably after one): what a
/// killed writer's store opens at, at the oldest. All of `done` if none.
fn intervalStart(done: []const Operation) usize {
    var start: ?usize = null;
    for (done, 0..) |operation, before| switch (operation) {
        .replace => {
            if (start == null) start = before;
        },
        // A compaction of a fixed store commits nothing.
        .compact => {},
        else => start = null,
    };
    return start orelse done.len;
}

/// The number of operations up to the last sync or reopen among `done`.
fn lastSync(done: []const Operation) usize {
    var last: usize = 0;
    for (done, 1..) |operation, count| {
        if (operation == .sync or operation == .reopen) last = count;
    }
    return last;
}

fn powerLossWorkload(
    workload_seed: u64,
    length: usize,
    seeds_per_call: u64,
    counts: *Counts,
) !void {
    var arena_state = std.heap.ArenaAllocator.init(gpa);
    defer arena_state.deinit();
    const arena = arena_state.allocator();
    const operations = try makeWorkload(workload_seed, length, arena);
    const states = try modelStates(operations, arena);
    var call: u64 = 0;
    while (true) : (call += 1) {
        // One process kill, then power losses with different seeds.
        for (0..seeds_per_call + 1) |k| {
            const seed: ?u64 = if (k == 0) null else workload_seed *% 1_000_003 +% call *% 31 +% k;
            const lost = powerLossTrial(operations, states, call, seed) catch |err| {
                std.debug.print(
                    "power-loss trial failed: workload seed {d}, length {d}, crash call {d}, " ++
                        "power seed {?d} (null: a process kill) (replay: " ++
                        "LOADERX_SIM_SEED={d})\n",
                    .{ workload_seed, length, call, seed, workload_seed },
                );
                return err;
            };
            if (!lost) return;
            counts.power_losses += 1;
        }
    }
}

// ---- faults ------------------------------------------------------------------------

const fault_plan = [_]struct { kind: storage.Kind, faults: []const storage.Fault }{
    .{ .kind = .write, .faults = &.{ .eio, .enospc, .short_write } },
    .{ .kind = .sync_file, .faults = &.{ .sync_fails, .eio } },
    .{ .kind = .sync_dir, .faults = &.{.sync_fails} },
    .{ .kind = .create, .faults = &.{ .eio, .enospc } },
    .{ .kind = .open, .faults = &.{.eio} },
    .{ .kind = .read, .faults = &.{.eio} },
    .{ .kind = .length, .faults = &.{.eio} },
    .{ .kind = .set_length, .faults = &.{.eio} },
    .{ .kind = .link, .faults = &.{ .eio, .enospc } },
    .{ .kind = .unlink, .faults = &.{.eio} },
    .{ .kind = .list, .faults = &.{.eio} },
    .{ .kind = .lock, .faults = &.{.eio} },
    .{ .kind = .map, .faults = &.{.eio} },
    .{ .kind = .make_dir, .faults = &.{ .eio, .enospc } },
};

/// Runs `operations` with `fault` at call `at` of `kind`. The operation it
/// hits must fail with a message and change nothing; the rest of the
/// workload then runs (reopening once if the writer refuses) and the final
/// store must equal the model without the failed operation. Returns whether
/// the fault fired.
fn faultTrial(
    operations: []const Operation,
    kind: storage.Kind,
    at: u64,
    fault: storage.Fault,
) !bool {
    const arena = freshArena();
    storage.reset();
    storage.injectFault(kind, at, fault);
    var model = Model{};
    var interval_model: ?Model = null;
    var store: ?*Store = null;
    defer if (store) |handle| handle.close();
    var fired = false;
    for (operations) |operation| {
        if (operation == .replace and interval_model == null) {
            interval_model = try model.clone(arena);
        }
        perform(&store, operation, arena) catch |err| {
            if (fired) return err; // Only one call fails.
            fired = storage.clearFault();
            try testing.expect(fired);
            try testing.expect(status.message().len > 0);
            // A writer that refuses until reopened (a failed sync, or an
            // in-place replace that failed after its journal record was
            // written) may hold a half-written view: it is closed first.
            var poisoned = false;
            if (store) |handle| {
                if (handle.writer != null and handle.writer.?.poisoned) {
                    handle.close();
                    store = null;
                    poisoned = true;
                }
            }
            // The committed state is what it was, for this handle and a new
            // one; only an in-place replace whose record the journal holds
            // may have happened, and then a new reader must see it whole.
            var after = try model.clone(arena);
            try after.apply(arena, operation);
            const reader = try Store.open(path, 1, true, true);
            defer reader.close();
            const committed = poisoned and operation == .replace and
                try sameRecords(reader, &after, arena);
            // durable=False: or at its last sync (`acceptRestored`).
            if (poisoned and !committed) {
                try acceptRestored(reader, &model, &interval_model, operation, arena);
            }
            try expectRecords(reader, if (committed) &after else &model, arena);
            if (store) |handle| try expectRecords(handle, &model, arena);
            // The store works again: at once, or after a reopen.
            if (!committed) try perform(&store, operation, arena);
        };
        if (!fired and operation == .reopen and storage.faultFired()) {
            // close() gave up on a failed sync (it reports nothing).
            fired = storage.clearFault();
            if (!try sameRecords(store.?, &model, arena)) {
                try acceptRestored(store.?, &model, &interval_model, operation, arena);
            }
        }
        try model.apply(arena, operation);
        // Any other commit is durable: the undo interval (`intervalStart`) ends.
        if (operation != .replace and operation != .compact) interval_model = null;
    }
    if (!fired) fired = storage.clearFault();
    if (store == null) store = try Store.open(path, 1, true, workload_durable);
    try expectState(store.?, &model, arena);
    return fired;
}

/// A durable=False writer that refuses until reopened (or whose close gave
/// up on a failed sync) had patched blocks in place since its last sync:
/// the reopened store is at that sync (undo.zig), and the workload goes on
/// from there (`model` becomes the interval's start).
fn acceptRestored(
    reopened: *Store,
    model: *Model,
    interval_model: *?Model,
    operation: Operation,
    arena: std.mem.Allocator,
) !void {
    if (workload_durable) return;
    const start = interval_model.* orelse return;
    if (!try sameRecords(reopened, &start, arena)) return;
    model.* = start;
    interval_model.* = if (operation == .replace) try model.clone(arena) else null;
}

fn faultWorkload(workload_seed: u64, length: usize, counts: *Counts) !void {
    var arena_state = std.heap.ArenaAllocator.init(gpa);
    defer arena_state.deinit();
    const arena = arena_state.allocator();
    const operations = try makeWorkload(workload_seed, length, arena);
    for (fault_plan) |plan| {
        for (plan.faults) |fault| {
            var at: u64 = 0;
            while (true) : (at += 1) {
                const fired = faultTrial(operations, plan.kind, at, fault) catch |err| {
                    std.debug.print(
                        "fault trial failed: workload seed {d}, length {d}, {s} at call {d} of " ++
                            "kind {s} (replay: LOADERX_SIM_SEED={d})\n",
                        .{
                            workload_seed,
                            length,
                            @tagName(fault),
                            at,
                            @tagName(plan.kind),
                            workload_seed,
                        },
                    );
                    return err;
                };
                if (!fired) break;
                counts.faults += 1;
            }
        }
    }
}

// ---- the tests ---------------------------------------------------------------------

fn envNumber(name: []const u8, default: u64) u64 {
    const text = std.process.getEnvVarOwned(gpa, name) catch return default;
    defer gpa.free(text);
    return std.fmt.parseInt(u64, text, 10) catch default;
}

fn report(counts: Counts) void {
    const target = std.process.getEnvVarOwned(gpa, "LOADERX_SIM_REPORT") catch return;
    defer gpa.free(target);
    var buffer: [256]u8 = undefined;
    const text = std.fmt.bufPrint(
        &buffer,
        "{{\"power_losses\": {d}, \"faults\": {d}, \"workloads\": {d}, \"undo_workloads\": {d}}}\n",
        .{ counts.power_losses, counts.faults, counts.workloads, counts.undo_workloads },
    ) catch unreachable;
    const file = std.fs.cwd().createFile(target, .{}) catch return;
    defer file.close();
    file.writeAll(text) catch {};
}

extern "c" fn mallopt(param: c_int, value: c_int) c_int;

/// Each run allocates and frees megabytes (row buffers, zstd contexts, the
/// disk's copies); glibc would map, fault in and unmap them every time, which
/// made the simulation 7x slower. Keep freed memory in the heap instead.
fn keepFreedMemory() void {
    const m_trim_threshold = -1;
    const m_mmap_threshold = -3;
    _ = mallopt(m_mmap_threshold, 64 << 20);
    _ = mallopt(m_trim_threshold, 1 << 30);
}

test "power loss at every call and every fault at every call leave the store whole" {
    keepFreedMemory();
    const scale = envNumber("LOADERX_SIM_SCALE", 1);
    const replay = envNumber("LOADERX_SIM_SEED", 0);
    trace_call = if (replay != 0) envNumber("LOADERX_SIM_TRACE", std.math.maxInt(u64)) else null;
    undo.sabotage = sabotageFromEnv();
    defer undo.sabotage = .none;
    const range_blocks_min = undo.range_blocks_min;
    defer undo.range_blocks_min = range_blocks_min;
    var counts = Counts{};
    const workloads = if (replay != 0) 1 else 12 * scale;
    for (0..workloads) |k| {
        const seed = if (replay != 0) replay else 1 + k;
        workload_durable = seed % 4 < 2 and seed < undo_seed_base;
        undo.range_blocks_min = rangeBlocksMin(seed);
        const length = workloadLength(seed);
        try powerLossWorkload(seed, length, 2, &counts);
        try faultWorkload(seed, length, &counts);
        counts.workloads += 1;
    }
    // Runs of unsynced replaces across sync() boundaries (undo.zig), longer.
    const undo_workloads = if (replay != 0) 0 else 6 * scale;
    for (0..undo_workloads) |k| {
        const seed = undo_seed_base + k;
        workload_durable = false;
        undo.range_blocks_min = rangeBlocksMin(seed);
        const length = workloadLength(seed);
        try powerLossWorkload(seed, length, 2, &counts);
        try faultWorkload(seed, length, &counts);
        counts.workloads += 1;
        counts.undo_workloads += 1;
    }
    report(counts);
    storage.reset();
}

test "the simulated disk loses unsynced writes and names, and keeps synced ones" {
    storage.reset();
    const store = try Store.open(path, 1, true, true);
    _ = try store.append("0123456789", &.{ 0, 5 }, .raw);
    store.close();
    // Every commit is durable: the worst power loss keeps it.
    for (0..20) |seed| {
        storage.powerLoss(seed);
        const reopened = try Store.open(path, 1, true, true);
        defer reopened.close();
        try testing.expectEqual(@as(u64, 2), reopened.count());
    }
}

test "a failed sync is not retried into a false success" {
    storage.reset();
    const store = try Store.open(path, 1, true, true);
    _ = try store.append("abcd", &.{0}, .raw);
    storage.injectFault(.sync_file, storage.kindCount(.sync_file), .sync_fails);
    try testing.expectError(error.Io, store.append("efgh", &.{0}, .raw));
    try testing.expect(storage.clearFault());
    try testing.expectEqual(@as(u64, 1), store.count());
    // The writer refuses until reopened, and says why.
    try testing.expectError(error.Io, store.append("ijkl", &.{0}, .raw));
    try testing.expect(
        std.mem.indexOf(u8, status.message(), "reopen") != null or
            std.mem.indexOf(u8, status.message(), "open it again") != null,
    );
    store.close();
    const reopened = try Store.open(path, 1, true, true);
    defer reopened.close();
    _ = try reopened.append("ijkl", &.{0}, .raw);
    try testing.expectEqual(@as(u64, 2), reopened.count());
}

test "regression: a new store's directory entry survives a power cut (its parent is synced)" {
    // Found by the trace-replay model: nothing synced the parent of a new
    // store directory, so a synced store could vanish whole.
    for (0..50) |seed| {
        storage.reset();
        const store = try Store.open("deep/er/store", 1, true, true);
        _ = try store.append("abcdef", &.{ 0, 3 }, .raw);
        store.close();
        storage.powerLoss(seed);
        const reopened = try Store.open("deep/er/store", 1, true, true);
        defer reopened.close();
        try testing.expectEqual(@as(u64, 2), reopened.count());
    }
}

test "regression: the only durable superblock generation is never overwritten" {
    // Found by the trace-replay model: appends did not sync their slot, so
    // the next commit could overwrite the last durable generation while the
    // other slot held an unsynced one; a tear fell back to an empty store.
    for (0..50) |seed| {
        storage.reset();
        const store = try Store.open(path, 1, true, true);
        for (0..5) |k| {
            var record: [8]u8 = undefined;
            @memset(&record, @intCast('a' + k));
            _ = try store.append(&record, &.{0}, .raw);
        }
        store.close();
        storage.powerLoss(seed);
        const reopened = try Store.open(path, 1, true, true);
        defer reopened.close();
        try testing.expectEqual(@as(u64, 5), reopened.count());
        try testing.expectEqual(@as(u32, 0), reopened.info().fell_back);
    }
}

test "recovery truncates files past their committed length and deletes orphans" {
    storage.reset();
    const store = try Store.open(path, 1, true, true);
    _ = try store.append("abcdefgh", &.{ 0, 4 }, .raw);
    // A writer that died mid-operation: bytes past the committed end and a
    // file no superblock names.
    const dir = try io.openDir(path);
    defer io.closeDir(dir);
    const stray = try io.createFile(dir, "index-00000000000000ff", true);
    io.closeFile(stray);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const data = try io.openFile(
        dir,
        format.fileName(&name_buffer, .data, store.head().superblock.data_file),
        .read_write,
    );
    try io.write(data, "garbage", 8);
    io.closeFile(data);
    store.close();
    const writer = try Store.open(path, 1, true, true);
    defer writer.close();
    _ = try writer.append("ijkl", &.{0}, .raw); // the first write recovers
    var names: std.ArrayList([]const u8) = .empty;
    defer names.deinit(testing.allocator);
    try storage.listNames(path, &names, testing.allocator);
    for (names.items) |name| try testing.expect(!std.mem.eql(u8, name, "index-00000000000000ff"));
    var target: [12]u8 = undefined;
    try writer.gather(&.{ 0, 1, 2 }, &target, null);
    try testing.expectEqualStrings("abcdefghijkl", &target);
}

test "a durable store's first replace after reopen: one sync; its journal survives a power cut" {
    // The append that creates a fixed store creates its journal too, under
    // the syncs it makes anyway: the first replace only syncs its record.
    for (0..20) |seed| {
        storage.reset();
        const store = try Store.open(path, 1, true, true);
        _ = try store.append("abcdefgh", &.{ 0, 4 }, .raw);
        store.close();
        storage.powerLoss(seed);
        const reopened = try Store.open(path, 1, true, true);
        defer reopened.close();
        try testing.expect(reopened.head().superblock.journal_file != 0);
        const syncs = storage.kindCount(.sync_file) + storage.kindCount(.sync_dir);
        try reopened.replace(&.{1}, "WXYZ", &.{0}, .raw);
        try testing.expectEqual(
            syncs + 1,
            storage.kindCount(.sync_file) + storage.kindCount(.sync_dir),
        );
    }
}

test "regression: a checkpoint after the creating append syncs the bytes later replaces wrote" {
    // Found by the soak-size simulation (workload seed 52): the creating
    // append's "data is synced" flag outlived its commit, so the checkpoint
    // that a growing journal forces skipped syncing what replaces had
    // written in place, and a power cut left a superblock past the journal
    // over torn rows.
    for (0..50) |seed| {
        storage.reset();
        const store = try Store.open(path, 1, true, true);
        var rows: [11 * fixed_record_bytes]u8 = undefined;
        var offsets: [11]u64 = undefined;
        for (&offsets, 0..) |*offset, k| offset.* = k * fixed_record_bytes;
        @memset(&rows, 'a');
        _ = try store.append(&rows, &offsets, .raw);
        const replaced = [_]u64{ 0, 1, 2, 3, 4, 5 };
        var fill: u8 = 'b';
        // Replaces of rows 0-5 until the journal passes its bound...
        while (true) {
            @memset(rows[0 .. replaced.len * fixed_record_bytes], fill);
            try store.replace(
                &replaced,
                rows[0 .. replaced.len * fixed_record_bytes],
                offsets[0..replaced.len],
                .raw,
            );
            fill += 1;
            if (store.writer.?.journal.?.end > @import("../journal.zig").checkpoint_bytes) break;
        }
        // ...then one of row 10, which checkpoints them first: the journal
        // holds only this one.
        const generation = store.head().superblock.generation;
        @memset(rows[0..fixed_record_bytes], 'z');
        try store.replace(&.{10}, rows[0..fixed_record_bytes], &.{0}, .raw);
        try testing.expectEqual(generation + 1, store.head().superblock.generation);
        // Power is cut with the writer open (a close would checkpoint again).
        storage.powerLoss(seed);
        const reopened = try Store.open(path, 1, true, true);
        defer reopened.close();
        var row: [fixed_record_bytes]u8 = undefined;
        try reopened.gather(&.{3}, &row, null);
        for (row) |byte| try testing.expectEqual(fill - 1, byte);
        try reopened.gather(&.{10}, &row, null);
        for (row) |byte| try testing.expectEqual(@as(u8, 'z'), byte);
        var damaged: [11]u64 = undefined;
        try testing.expectEqual(@as(u64, 0), try reopened.verify(0, 11, &damaged));
    }
}

test "durable=False: one sync per block first touched; a power cut opens at the last sync" {
    // 40 records of 1000 B: blocks 0 and 1 whole, the tail block partial.
    var rows: [40 * fixed_record_bytes]u8 = undefined;
    var offsets: [40]u64 = undefined;
    for (&offsets, 0..) |*offset, k| offset.* = k * fixed_record_bytes;
    undo.sabotage = sabotageFromEnv();
    defer undo.sabotage = .none;
    for (0..20) |seed| {
        storage.reset();
        @memset(&rows, 'a');
        const store = try Store.open(path, 1, true, false);
        _ = try store.append(&rows, &offsets, .raw);
        try store.sync();
        // The first replace of the store creates its journal and undo file.
        try store.replace(&.{39}, rows[0..fixed_record_bytes], &.{0}, .raw);
        try store.sync();
        const synced = storage.kindCount(.sync_file) + storage.kindCount(.sync_dir);
        const row = [_]u8{'Z'} ** fixed_record_bytes;
        // Rows 1 and 2 (block 0) and 38 (the tail block): one sync for both blocks.
        try store.replace(&.{ 1, 2, 38 }, &(row ++ row ++ row), &.{ 0, 1000, 2000 }, .raw);
        try testing.expectEqual(
            synced + 1,
            storage.kindCount(.sync_file) + storage.kindCount(.sync_dir),
        );
        // Blocks saved already: no sync at all.
        for (0..10) |k| try store.replace(&.{3 + k}, &row, &.{0}, .raw);
        try store.replace(&.{37}, &row, &.{0}, .raw);
        try testing.expectEqual(
            synced + 1,
            storage.kindCount(.sync_file) + storage.kindCount(.sync_dir),
        );
        // The store is abandoned to the power cut, as by a crash.
        storage.powerLoss(seed);
        const reopened = try Store.open(path, 1, true, false);
        var out: [40 * fixed_record_bytes]u8 = undefined;
        var indices: [40]u64 = undefined;
        for (&indices, 0..) |*index, k| index.* = k;
        try reopened.gather(&indices, &out, &offsets);
        try testing.expect(std.mem.allEqual(u8, &out, 'a'));
        var damaged: [40]u64 = undefined;
        try testing.expectEqual(@as(u64, 0), try reopened.verify(0, 40, &damaged));
        // And sync() keeps what it covers.
        try reopened.replace(&.{5}, &row, &.{0}, .raw);
        try reopened.sync();
        storage.powerOffAt(storage.callCount()); // close() writes nothing durable now
        reopened.close();
        storage.powerLoss(seed + 100);
        const again = try Store.open(path, 1, true, false);
        defer again.close();
        try again.gather(&.{5}, out[0..fixed_record_bytes], &.{0});
        try testing.expect(std.mem.allEqual(u8, out[0..fixed_record_bytes], 'Z'));
    }
}
