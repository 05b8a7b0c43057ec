//! The redo journal of a fixed store: in-place replaces that cost what they
//! change (k rows and the 16 KiB blocks they touch), not a rewrite.
//!
//! A replace (1) appends one checksummed record {sequence, base generation,
//! rows, new block checksums, new tail checksum} to `journal-<id>` and syncs
//! it: that is the commit point, one fdatasync; (2) writes the rows and the
//! sums into the data and sums files, unsynced, with the sequence lock of
//! the journal's shared page odd, so no gather sees half of it. A checkpoint
//! (any other commit, sync(), close(), or the next replace once the
//! journal is past `checkpoint_bytes`) syncs the data and sums files and commits a superblock
//! whose `journal_sequence` says "applied through S"; the journal then
//! starts over. Recovery (a writer's begin, a reader that finds no live
//! writer) replays, in order, every valid record after the checkpoint whose
//! base generation is current, stopping at the first torn or foreign one.
//! Replay writes whole block images (old bytes with the rows laid over), so
//! it is idempotent.
//!
//! Invariant: committed bytes change in place only inside the sequence
//! lock's odd window, only after the record that describes them is durable,
//! and the record is dropped only after a superblock that covers it is.
const std = @import("std");
const builtin = @import("builtin");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const plans = @import("plans.zig");
const seqlock = @import("seqlock.zig");
const integrity = @import("integrity.zig");
const workers = @import("workers.zig");
const Snapshot = @import("snapshot.zig").Snapshot;

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Superblock = format.Superblock;
const JournalPage = format.JournalPage;
const JournalRecord = format.JournalRecord;
const Patch = plans.Patch;
const block_bytes = format.block_bytes;
const page_bytes = format.journal_page_bytes;

/// A journal past this many bytes is checkpointed before the next replace
/// (or at any other commit, sync or close), so replay after a crash reads
/// at most this much plus one record.
/// Tests use a small bound so that the simulation checkpoints mid-workload.
pub const checkpoint_bytes: u64 = if (builtin.is_test) 16 << 10 else 1 << 20;
/// The journal grows by written zeros, this much at a time, so that a
/// record usually overwrites allocated blocks and its fdatasync flushes
/// data only, not a new file length (about 10x cheaper on ext4).
/// Tests use a small step so that records both fit and overflow it.
const grow_bytes: u64 = if (builtin.is_test) 4 << 10 else 64 << 10;
const zeros = [_]u8{0} ** grow_bytes;
/// Blocks read, patched and written at a time: 1 MiB of scratch.
pub const run_blocks_max = 64;

/// The journal as the writer (or a settling reader) holds it.
pub const Handle = struct {
    file: io.File,
    /// The shared page, mapped from the lock file by whoever opened the
    /// handle (the writer, for as long as it lives; a settling reader, for
    /// the settle), which also unmaps it.
    memory: io.WritableMemory,
    /// Where records start (the journal's version says).
    start: u64,
    /// Where the next record goes.
    end: u64,
    /// The file's length: records below it overwrite written zeros.
    allocated: u64 = page_bytes,
    /// The last sequence written; the superblock's journal_sequence when
    /// nothing was replaced since the last checkpoint.
    last_sequence: u64,

    /// Writes zeros past the end for small records to land in; a record
    /// larger than a step just extends the file.
    fn grow(handle: *Handle, record_bytes: u64) Error!void {
        assert(record_bytes % 8 == 0);
        handle.invariant();
        const needed = handle.end + record_bytes;
        if (needed <= handle.allocated or record_bytes > grow_bytes) return;
        const target = std.mem.alignForward(u64, needed, grow_bytes);
        while (handle.allocated < target) {
            const step = @min(grow_bytes, target - handle.allocated);
            try io.write(handle.file, zeros[0..step], handle.allocated);
            handle.allocated += step;
        }
        assert(handle.allocated >= needed);
    }

    /// Starts over after a checkpoint. The file keeps its length while the
    /// writer lives: the next records overwrite blocks already allocated
    /// (so their fdatasync writes no new file length), and the checkpoint
    /// after a large record does not wait for the file system to free it
    /// (7 ms for 24 MB here). Records left past `end` are dead: each names
    /// a base generation older than the superblock that covers it.
    pub fn restart(handle: *Handle) void {
        handle.end = handle.start;
        handle.invariant();
    }

    /// Records lie between the journal's header and the file's end.
    fn invariant(handle: *const Handle) void {
        assert(handle.start <= page_bytes);
        assert(handle.start <= handle.end);
    }

    /// Cuts a restarted journal back to its first page: when the writer
    /// starts and when it closes, so an idle store holds at most a page of
    /// dead records.
    pub fn trim(handle: *Handle) Error!void {
        assert(handle.end == handle.start);
        if (handle.allocated > page_bytes) {
            try io.setLength(handle.file, page_bytes);
            handle.allocated = page_bytes;
        }
        assert(handle.allocated == page_bytes);
    }

    pub fn close(handle: *Handle) void {
        handle.invariant();
        io.closeFile(handle.file);
    }

    pub fn lock(handle: *Handle) void {
        assert(handle.memory.len >= seqlock.shared_page_bytes);
        seqlock.lockPage(handle.memory);
    }

    pub fn unlock(handle: *Handle, generation: u64, tail_checksum: u64) void {
        assert(handle.memory.len >= seqlock.shared_page_bytes);
        seqlock.unlockPage(handle.memory, generation, tail_checksum);
    }
};

fn fileName(buffer: *[format.file_name_bytes]u8, id: u64) [:0]const u8 {
    assert(id != 0); // A superblock without a journal names file 0.
    return format.fileName(buffer, .journal, id);
}

/// Creates journal file `id` whole (its page written and synced) before any
/// superblock names it.
pub fn createFile(dir: io.Dir, id: u64, superblock: *const Superblock) Error!void {
    assert(id != 0 and id > superblock.generation or id == superblock.data_file);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const file = try io.createFile(dir, fileName(&name_buffer, id), true);
    defer io.closeFile(file);
    var bytes = [_]u8{0} ** page_bytes;
    const page = JournalPage{
        .magic = format.journal_magic,
        .version = format.journal_version,
        .reserved0 = 0,
        .sequence_lock = 0,
        .tail_generation = superblock.generation,
        .tail_checksum = superblock.tail_checksum,
        .synced_generation = 0,
        .synced_check = 0,
        .reserved = @splat(0),
    };
    @memcpy(bytes[0..@sizeOf(JournalPage)], std.mem.asBytes(&page));
    // The writer's side of `checkPage`: a whole page of this version.
    assert(format.journalRecordsStart(page.version) <= bytes.len);
    try io.write(file, &bytes, 0);
    try io.sync(file);
}

/// Opens the journal `superblock` names read-write, with `memory` the
/// shared page (`seqlock.mapPage`). Caller holds the writer lock.
pub fn open(dir: io.Dir, superblock: *const Superblock, memory: io.WritableMemory) Error!Handle {
    assert(superblock.journal_file != 0);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const file = try io.openFile(dir, fileName(&name_buffer, superblock.journal_file), .read_write);
    errdefer io.closeFile(file);
    const checked = try checkPage(dir, file);
    assert(checked.start <= checked.length);
    return .{
        .file = file,
        .memory = memory,
        .last_sequence = superblock.journal_sequence,
        .start = checked.start,
        .end = checked.start,
        .allocated = checked.length,
    };
}

/// A journal shorter than its page or with another magic is damage: its
/// page is written and synced before any superblock names the file.
/// Returns where its records start, and the file's length.
pub fn checkPage(dir: io.Dir, file: io.File) Error!struct { start: u64, length: u64 } {
    var page: JournalPage = undefined;
    const got = try io.read(file, std.mem.asBytes(&page), 0);
    const length = try io.length(file);
    if (got != @sizeOf(JournalPage) or length < page_bytes or
        !std.mem.eql(u8, &page.magic, &format.journal_magic))
    {
        return status.fail(
            error.Corrupt,
            "store '{s}' is damaged: journal '{s}' has no valid page; restore the store from a " ++
                "copy",
            .{ dir.path, file.name() },
        );
    }
    if (page.version != 1 and page.version != format.journal_version) {
        return status.fail(
            error.UnsupportedVersion,
            "store '{s}' has a journal of version {d}, which this loaderx cannot read (it reads " ++
                "1 and {d}); upgrade loaderx",
            .{ dir.path, page.version, format.journal_version },
        );
    }
    const start = format.journalRecordsStart(page.version);
    assert(start <= page_bytes and length >= page_bytes);
    return .{ .start = start, .length = length };
}

/// Whether the journal may hold a record to replay: the record after the
/// checkpoint would start with a header naming the next sequence and the
/// current generation. Cheap: one read of a header.
fn mayHoldRecords(handle: *const Handle, superblock: *const Superblock) Error!bool {
    handle.invariant();
    var record: JournalRecord = undefined;
    if (try io.read(handle.file, std.mem.asBytes(&record), handle.start) != @sizeOf(
        JournalRecord,
    )) return false;
    return isNext(&record, superblock.journal_sequence + 1, superblock);
}

/// Whether a record header is a journal record's, the `sequence`-th, of
/// generation `superblock` (before any other field is trusted).
fn isNext(record: *const JournalRecord, sequence: u64, superblock: *const Superblock) bool {
    return std.mem.eql(u8, &record.magic, &format.journal_magic) and
        record.sequence == sequence and record.base_generation == superblock.generation;
}

// ---- blocks touched by a replace -------------------------------------------------

/// The data files a replace changes, and where it changes them.
pub const Target = struct {
    data: io.File,
    sums: io.File,
    data_bytes: u64,
    stride: u64,
    /// The live writer's mappings of both files for small patches
    /// (`applyLive`); null for a replay's target, which writes by `pwrite`.
    maps: ?Maps = null,
};

pub const Maps = struct {
    data: io.WritableMemory,
    sums: io.WritableMemory,

    fn unmap(maps: Maps) void {
        io.unmapWritable(maps.data);
        io.unmapWritable(maps.sums);
    }
};

fn patchStart(patch: Patch, stride: u64) u64 {
    assert(stride > 0);
    return patch.row * stride;
}

/// Calls `visit(context, first_block, image)` for every run of at most
/// `run_blocks_max` blocks that `patches` (ascending rows) touch, with
/// `image` the run's bytes as they are after the patches. A live replace
/// passes `committed`, the writer's snapshot of the generation it patches:
/// each block is copied from its mapping and checked against its committed
/// checksum first (error.Corrupt), since a block damaged on disk would
/// otherwise get a checksum of its damaged bytes and `verify` would pass
/// from then on. Replay reads the file and checks nothing: a crash may
/// leave a block half applied.
pub fn forEachRun(
    target: Target,
    patches: []const Patch,
    scratch: []u8,
    committed: ?*const Snapshot,
    context: anytype,
    comptime visit: anytype,
) Error!void {
    assert(scratch.len == run_blocks_max * block_bytes);
    assert(target.stride > 0 and patches.len > 0);
    const stride = target.stride;
    var passed: usize = 0; // Patches before it end at or before the current run.
    var next: usize = 0;
    while (next < patches.len) {
        const first = patchStart(patches[next], stride) / block_bytes;
        var last = (patchStart(patches[next], stride) + stride - 1) / block_bytes;
        next += 1;
        while (next < patches.len and
            patchStart(patches[next], stride) / block_bytes <= last + 1)
        {
            // Rows that continue this one's numbering lie back to back: all join.
            next += consecutiveRows(patches[next..], patches.len - next);
            last = @max(last, (patchStart(patches[next - 1], stride) + stride - 1) / block_bytes);
        }
        var block = first;
        while (block <= last) {
            const start = block * block_bytes;
            while (passed < patches.len and patchStart(patches[passed], stride) + stride <= start) {
                // Of rows that continue this one's numbering, the first ending past `start`.
                const run = consecutiveRows(patches[passed..], patches.len - passed);
                passed += @min(run, start / stride - patches[passed].row);
            }
            const block_end = runEnd(patches[passed..], stride, block, last);
            const end = @min(block_end * block_bytes, target.data_bytes);
            const image = covering(patches[passed..], stride, start, end) orelse image: {
                const image = scratch[0 .. end - start];
                if (committed) |snapshot| {
                    try checkRun(snapshot, stride, block, end, patches[passed..]);
                    @memcpy(image, snapshot.dataBytes()[start..end]);
                } else if (try io.read(target.data, image, start) != image.len) {
                    return status.fail(
                        error.Corrupt,
                        "data file '{s}' is shorter than committed",
                        .{target.data.name()},
                    );
                }
                var k = passed;
                while (k < patches.len and patchStart(patches[k], stride) < end) : (k += 1) {
                    const row_start = patchStart(patches[k], stride);
                    const from = @max(row_start, start);
                    const to = @min(row_start + stride, end);
                    @memcpy(
                        image[from - start .. to - start],
                        patches[k].bytes[from - row_start .. to - row_start],
                    );
                }
                break :image image;
            };
            try visit(context, block, image);
            block = block_end;
        }
    }
}

/// Checks the blocks from `first` to data byte `end` against their
/// committed checksums, but for blocks `patches` (ascending, from the first
/// that reaches the run) replace whole: replacing every record of a damaged
/// block is how it is repaired.
fn checkRun(
    snapshot: *const Snapshot,
    stride: u64,
    first: u64,
    end: u64,
    patches: []const Patch,
) Error!void {
    assert(end > first * block_bytes and end <= snapshot.dataBytes().len);
    var next: usize = 0; // the first patch not before the current block
    var block = first;
    while (block * block_bytes < end) : (block += 1) {
        const start = block * block_bytes;
        const first_row = start / stride;
        const last_row = (@min(start + block_bytes, end) - 1) / stride;
        while (next < patches.len and patches[next].row < first_row) next += 1;
        var rows: usize = 0; // rows of this block replaced (unique, ascending)
        while (next + rows < patches.len and patches[next + rows].row <= last_row) rows += 1;
        if (rows == last_row - first_row + 1) continue;
        if (!integrity.blockSound(snapshot, block)) {
            return integrity.damagedBlock(block, first_row, last_row, "replace");
        }
    }
}

/// Where the run that starts at `block` ends (exclusive), `last` the last
/// block of the group: at least `covered_blocks_min` blocks that the rows
/// from `patches[0]` on cover whole, back to back in the caller's memory,
/// make runs of their own (neither read nor copied); the blocks before them
/// another. So a large contiguous replace reads only its two edge blocks.
/// Runs stay at most `run_blocks_max` blocks, and each call costs O(log n)
/// (rows that continue the first's numbering are found by halving).
fn runEnd(patches: []const Patch, stride: u64, block: u64, last: u64) u64 {
    assert(patches.len > 0); // patches[0] touches `block`
    const plain_end = @min(last + 1, block + run_blocks_max);
    const first_byte = patchStart(patches[0], stride);
    const covered_start = std.math.divCeil(u64, first_byte, block_bytes) catch unreachable;
    const reach = @min(last + 1, @max(block, covered_start) + run_blocks_max) * block_bytes;
    assert(reach > first_byte);
    const rows_max = @min(
        patches.len,
        std.math.divCeil(u64, reach - first_byte, stride) catch unreachable,
    );
    const rows = consecutiveRows(patches, rows_max);
    // Back to back in memory at both ends; `covering` checks every row.
    const first_row_at = @intFromPtr(patches[0].bytes.ptr);
    const last_row_at = @intFromPtr(patches[rows - 1].bytes.ptr);
    if (last_row_at != first_row_at + (rows - 1) * stride) return plain_end;
    const covered_end = @min(last + 1, (first_byte + rows * stride) / block_bytes);
    if (covered_end < covered_start + covered_blocks_min) return plain_end;
    if (block >= covered_start) return if (block < covered_end) @min(
        covered_end,
        block + run_blocks_max,
    ) else plain_end;
    return @min(plain_end, covered_start);
}

/// How many of the first `limit` of `patches` (ascending, unique rows)
/// continue the first's row numbering, the first included. Rows ascend and
/// repeat none, so `row - k` never falls and they are a prefix: found by
/// galloping, then halving (O(log n) for n of them, O(1) for one).
fn consecutiveRows(patches: []const Patch, limit: usize) usize {
    assert(limit >= 1 and limit <= patches.len);
    const first = patches[0].row;
    var rows: usize = 1; // patches[0..rows] continue
    var reach: usize = 1;
    while (rows + reach <= limit and patches[rows + reach - 1].row == first + rows + reach - 1) {
        rows += reach;
        reach *= 2;
    }
    // patches[beyond] does not continue, or lies past the limit.
    var beyond = @min(limit, rows + reach - 1);
    while (rows < beyond) {
        const middle = rows + (beyond - rows) / 2;
        if (patches[middle].row == first + middle) rows = middle + 1 else beyond = middle;
    }
    return rows;
}

/// Fewer whole blocks than this are read with their edges, as one run:
/// splitting them off would read the edges twice and write three times.
const covered_blocks_min = 4;

/// The run `start..end` as the caller's bytes, when `patches` (from the
/// first that ends past `start`) cover it with consecutive rows laid out
/// back to back in memory: a large contiguous replace is neither read nor
/// copied. Null otherwise.
fn covering(patches: []const Patch, stride: u64, start: u64, end: u64) ?[]const u8 {
    assert(start < end);
    if (patches.len == 0 or patchStart(patches[0], stride) > start) return null;
    const first = patches[0];
    const rows = std.math.divCeil(u64, end - patchStart(first, stride), stride) catch unreachable;
    if (rows > patches.len) return null;
    const last = patches[rows - 1];
    if (last.row != first.row + rows - 1) return null; // Rows ascend and are unique.
    if (backToBack(patches[0..rows], stride) < rows) return null;
    const from = start - patchStart(first, stride);
    return first.bytes.ptr[from..][0 .. end - start];
}

/// How many of `patches`, from the first, lie back to back in memory (each
/// row's bytes right after the previous row's).
fn backToBack(patches: []const Patch, stride: u64) usize {
    assert(patches.len > 0);
    const base = @intFromPtr(patches[0].bytes.ptr);
    var count: usize = 1;
    while (count < patches.len and @intFromPtr(patches[count].bytes.ptr) == base + count * stride)
        count += 1;
    assert(count >= 1 and count <= patches.len);
    return count;
}

/// The new checksums of the blocks `patches` touch, as `forEachRun` with
/// `Sums.visit` finds them (committed blocks checked first), on up to
/// `threads` threads: a replace of rows scattered over many blocks hashes
/// two images of each, which one core does at memory speed (3.6 ms of a
/// 1,000-block replace's 7). The patches split only where `forEachRun`
/// starts a new group of runs (the next row's block is past the previous
/// row's block plus one), so each part visits exactly the runs, blocks and
/// images the whole would, and the parts' lists, in order, are the whole's.
/// A part that fails makes the whole run again on this thread, which
/// reports the first failure with its message (a part's message stays on
/// its pool thread).
pub fn computeSums(
    target: Target,
    patches: []const Patch,
    scratch: []u8,
    committed: *const Snapshot,
    threads: u32,
    sums: *Sums,
) Error!void {
    assert(sums.runs == 0 and sums.blocks.items.len == 0);
    const parts_max = 8;
    var bounds: [parts_max + 1]usize = undefined;
    // Tests split wherever they can (in up to three parts), so that the
    // simulator's replaces (one thread) run the split and the merge.
    const parts_wanted: u32 = if (builtin.is_test) 3 else @min(threads, parts_max);
    const parts = splitGroups(patches, target.stride, parts_wanted, &bounds);
    if (parts < 2) return forEachRun(target, patches, scratch, committed, sums, Sums.visit);
    var found: [parts_max]Sums = @splat(.{});
    var failed: [parts_max]bool = @splat(false);
    var scratches: [parts_max][]u8 = undefined;
    scratches[0] = scratch;
    var allocated: usize = 1;
    defer for (scratches[1..allocated]) |buffer| allocator.free(buffer);
    defer for (found[0..parts]) |*part| part.deinit();
    while (allocated < parts) : (allocated += 1) {
        scratches[allocated] = allocator.alloc(u8, scratch.len) catch return error.OutOfMemory;
    }
    const context = SumParts{
        .target = target,
        .patches = patches,
        .committed = committed,
        .bounds = bounds[0 .. parts + 1],
        .scratches = scratches[0..parts],
        .found = found[0..parts],
        .failed = failed[0..parts],
    };
    workers.parallelForEach(parts, patches.len * block_bytes, threads, &context, SumParts.run);
    if (std.mem.indexOfScalar(bool, failed[0..parts], true) != null) {
        return forEachRun(target, patches, scratch, committed, sums, Sums.visit);
    }
    for (found[0..parts], 0..) |*part, k| {
        // Only the last part can reach the tail block (rows ascend).
        assert(part.tail_checksum == null or k == parts - 1);
        sums.blocks.appendSlice(allocator, part.blocks.items) catch return error.OutOfMemory;
        sums.sums.appendSlice(allocator, part.sums.items) catch return error.OutOfMemory;
        sums.runs += part.runs;
        sums.tail_checksum = part.tail_checksum;
    }
    // `last_image` lies in a part's scratch, freed on return: only a replace
    // of one run writes it again, and two parts make two runs at least.
    assert(sums.runs >= parts);
    sums.last_image = &.{};
}

/// The parts of a `computeSums`, each walked by one pool task.
const SumParts = struct {
    target: Target,
    patches: []const Patch,
    committed: *const Snapshot,
    bounds: []const usize,
    scratches: [][]u8,
    found: []Sums,
    failed: []bool,

    fn run(context: *const @This(), first: u64, end: u64) void {
        for (first..end) |k| {
            const part = context.patches[context.bounds[k]..context.bounds[k + 1]];
            forEachRun(
                context.target,
                part,
                context.scratches[k],
                context.committed,
                &context.found[k],
                Sums.visit,
            ) catch {
                context.failed[k] = true;
            };
        }
    }
};

/// Splits `patches` into at most `parts_max` parts of about equal length at
/// group starts (`computeSums`); writes the parts' bounds and returns how
/// many parts there are (1: no split worth making).
fn splitGroups(
    patches: []const Patch,
    stride: u64,
    parts_max: u32,
    bounds: []usize,
) usize {
    assert(bounds.len >= parts_max + 1);
    // A pool handoff costs microseconds: a part hashes this many blocks at least.
    const part_patches_min = if (builtin.is_test) 1 else 64;
    const parts_wanted = @min(parts_max, patches.len / part_patches_min);
    bounds[0] = 0;
    if (parts_wanted < 2) return 1;
    var parts: usize = 0;
    for (1..parts_wanted) |k| {
        var at = @max(bounds[parts] + 1, patches.len * k / parts_wanted);
        while (at < patches.len and !groupStarts(patches, stride, at)) at += 1;
        if (at >= patches.len) break;
        parts += 1;
        bounds[parts] = at;
    }
    parts += 1;
    bounds[parts] = patches.len;
    return parts;
}

/// Whether `forEachRun` starts a new group at `patches[at]`: its first block
/// lies past the block after the previous row's last.
fn groupStarts(patches: []const Patch, stride: u64, at: usize) bool {
    assert(at > 0 and at < patches.len);
    const previous_last = (patchStart(patches[at - 1], stride) + stride - 1) / block_bytes;
    return patchStart(patches[at], stride) / block_bytes > previous_last + 1;
}

/// The new checksums of the blocks a replace touches.
pub const Sums = struct {
    blocks: std.ArrayList(u64) = .empty,
    sums: std.ArrayList(u64) = .empty,
    tail_checksum: ?u64 = null,
    /// The runs visited, and the last one's first block and image: a
    /// replace of one run can write that image without reading it again.
    runs: usize = 0,
    last_first: u64 = 0,
    last_image: []const u8 = &.{},

    pub fn deinit(sums: *Sums) void {
        sums.blocks.deinit(allocator);
        sums.sums.deinit(allocator);
    }

    pub fn visit(sums: *Sums, first: u64, image: []const u8) Error!void {
        assert(image.len > 0);
        sums.runs += 1;
        sums.last_first = first;
        sums.last_image = image;
        var at: u64 = 0;
        var block = first;
        while (at < image.len) : (block += 1) {
            const bytes = image[at..@min(at + block_bytes, image.len)];
            const checksum = format.blockChecksum(block, bytes);
            if (bytes.len == block_bytes) {
                sums.blocks.append(allocator, block) catch return error.OutOfMemory;
                sums.sums.append(allocator, checksum) catch return error.OutOfMemory;
            } else {
                sums.tail_checksum = checksum;
            }
            at += bytes.len;
        }
        assert(sums.blocks.items.len == sums.sums.items.len);
    }
};

pub fn writeImage(target: *const Target, first: u64, image: []const u8) Error!void {
    // Whole committed blocks, or the tail up to the committed length.
    assert(image.len > 0);
    assert(first * block_bytes + image.len <= target.data_bytes);
    // No write-back started here: the checkpoint, amortised over many
    // replaces, syncs these pages (the kernel may write them back before).
    // Starting it from the caller cost the 500K-row replace about 2 ms of
    // its 20 MB (20 sync_file_range calls of 0.1 ms each).
    try io.write(target.data, image, first * block_bytes);
}

/// Writes the patched blocks and their sums. Called inside the sequence
/// lock; idempotent, so replay may run it again after any crash.
pub fn apply(
    target: Target,
    patches: []const Patch,
    blocks: []const u64,
    sums: []const u64,
    scratch: []u8,
) Error!void {
    assert(patches.len > 0 and blocks.len == sums.len);
    try forEachRun(target, patches, scratch, null, &target, writeImage);
    try writeSums(target, blocks, sums);
}

/// A live replace's rows up to this many bytes go through the writer's
/// mappings (`io.writePatch`: a fault on a page's first store after its
/// write-back, where each `pwrite` costs ext4 about 5 us), more by `pwrite`
/// of whole runs, whose per-call cost is small against their bytes.
pub const patch_bytes_max = 1 << 20;

/// Writes a live replace's rows and the new sums `sums` (its `forEachRun`)
/// in place. Called inside the sequence lock.
pub fn applyLive(
    target: *const Target,
    patches: []const Patch,
    sums: *const Sums,
    scratch: []u8,
) Error!void {
    assert(patches.len > 0 and sums.runs > 0);
    const maps = target.maps orelse return applyWritten(target, patches, sums, scratch);
    const stride = target.stride;
    if (patches.len * stride > patch_bytes_max) return applyWritten(target, patches, sums, scratch);
    var k: usize = 0;
    while (k < patches.len) {
        // Rows that follow each other on disk and in memory: one store.
        var rows: usize = 1;
        const base = @intFromPtr(patches[k].bytes.ptr);
        while (k + rows < patches.len and patches[k + rows].row == patches[k].row + rows and
            @intFromPtr(patches[k + rows].bytes.ptr) == base + rows * stride) rows += 1;
        const bytes = patches[k].bytes.ptr[0 .. rows * stride];
        io.writePatch(target.data, maps.data, bytes, patches[k].row * stride);
        k += rows;
    }
    const blocks = sums.blocks.items;
    var b: usize = 0;
    while (b < blocks.len) {
        var run: usize = 1;
        while (b + run < blocks.len and blocks[b + run] == blocks[b] + run) run += 1;
        const bytes = std.mem.sliceAsBytes(sums.sums.items[b..][0..run]);
        io.writePatch(target.sums, maps.sums, bytes, blocks[b] * 8);
        b += run;
    }
}

fn applyWritten(
    target: *const Target,
    patches: []const Patch,
    sums: *const Sums,
    scratch: []u8,
) Error!void {
    // One run (a row, or rows close together): its patched image is still
    // in the scratch (or is the caller's rows), and the data under it
    // cannot have changed (this is the one writer), so it is written
    // without reading it again.
    if (sums.runs == 1) {
        try writeImage(target, sums.last_first, sums.last_image);
        return writeSums(target.*, sums.blocks.items, sums.sums.items);
    }
    return apply(target.*, patches, sums.blocks.items, sums.sums.items, scratch);
}

pub fn writeSums(target: Target, blocks: []const u64, sums: []const u64) Error!void {
    assert(blocks.len == sums.len);
    var k: usize = 0;
    while (k < blocks.len) {
        var run: usize = 1;
        while (k + run < blocks.len and blocks[k + run] == blocks[k] + run) run += 1;
        try io.write(target.sums, std.mem.sliceAsBytes(sums[k..][0..run]), blocks[k] * 8);
        k += run;
    }
    assert(k == blocks.len);
}

// ---- the live replace -------------------------------------------------------------

/// The superblock after `current` that names a new journal, whose file is
/// created whole and synced first: once per store, before its first
/// in-place replace, for a store whose first append did not create it
/// (opened with durable=False, or older).
pub fn withNewJournal(dir: io.Dir, current: Superblock) Error!Superblock {
    assert(current.journal_file == 0);
    var next = current;
    next.journal_file = next.generation + 1;
    next.journal_sequence = 0;
    assert(next.journal_file > current.generation);
    try createFile(dir, next.journal_file, &next);
    return next;
}

/// The patches of a replace of rows `indices` of `stride` bytes, packed in
/// `source` at `offsets`, in ascending rows. `ascending`: the indices
/// ascend strictly already (the caller checked). The caller frees them.
pub fn patchesOf(
    indices: []const u64,
    ascending: bool,
    source: []const u8,
    offsets: []const u64,
    stride: u64,
) Error![]Patch {
    assert(indices.len == offsets.len and stride > 0);
    const patches = allocator.alloc(Patch, indices.len) catch return error.OutOfMemory;
    for (indices, offsets, patches) |index, offset, *patch| {
        patch.* = .{ .row = index, .bytes = source[offset..][0..stride] };
    }
    if (!ascending) std.mem.sort(Patch, patches, {}, Patch.lessThan);
    assert(std.sort.isSorted(Patch, patches, {}, Patch.lessThan));
    return patches;
}

/// Journals and applies a replace of `patches` (ascending, unique rows of
/// `target.stride` bytes) on top of generation `superblock`. Returns the new
/// tail checksum. The record is durable before any committed byte changes.
/// A failed sync, or a failure after the commit point, sets `poisoned`: this
/// handle's view may be half written, and only a reopen (which replays the
/// journal) is sure.
pub fn replace(
    handle: *Handle,
    target: Target,
    superblock: *const Superblock,
    patches: []const Patch,
    committed: *const Snapshot,
    threads: u32,
    poisoned: *bool,
) Error!u64 {
    assert(patches.len > 0 and target.stride == superblock.record_bytes);
    assert(handle.last_sequence >= superblock.journal_sequence);
    const scratch = allocator.alloc(
        u8,
        run_blocks_max * block_bytes,
    ) catch return error.OutOfMemory;
    defer allocator.free(scratch);
    var sums = Sums{};
    defer sums.deinit();
    try computeSums(target, patches, scratch, committed, threads, &sums);
    assert(sums.runs > 0 and sums.blocks.items.len == sums.sums.items.len);
    const tail_checksum = sums.tail_checksum orelse committed.tailChecksum();
    const record_bytes = try writeRecord(
        handle,
        superblock,
        target.stride,
        patches,
        sums.blocks.items,
        sums.sums.items,
        tail_checksum,
        poisoned,
    );
    handle.end += record_bytes;
    handle.last_sequence += 1;
    assert(record_bytes % 8 == 0 and handle.end <= handle.allocated);
    handle.lock();
    defer handle.unlock(superblock.generation, tail_checksum);
    applyLive(&target, patches, &sums, scratch) catch |err| {
        poisoned.* = true;
        return status.wrap(
            err,
            "the replace is committed in the journal but applying it failed; close the store " ++
                "and open it again, which applies it",
            .{},
        );
    };
    return tail_checksum;
}

/// A record's rows are staged through a buffer this large on their way to
/// the journal (and its checksum): a large replace needs no buffer of its
/// own size, whose allocation and page faults cost more than the copy.
const stage_bytes = 1 << 20;

/// Appends one record and syncs it. On failure the record's header is
/// zeroed in the page cache, as far as the disk allows, so that no replay
/// takes a replace that reported failure.
fn writeRecord(
    handle: *Handle,
    superblock: *const Superblock,
    stride: u64,
    patches: []const Patch,
    blocks: []const u64,
    sums: []const u64,
    tail_checksum: u64,
    poisoned: *bool,
) Error!u64 {
    const k = patches.len;
    const lists_bytes = (k + 2 * blocks.len) * 8;
    const body_bytes = lists_bytes + k * stride;
    const total = std.mem.alignForward(u64, @sizeOf(JournalRecord) + body_bytes, 8);
    assert(blocks.len == sums.len and k > 0);
    // The header and the row, block and sum lists.
    const head = allocator.alignedAlloc(
        u8,
        .@"8",
        @sizeOf(JournalRecord) + lists_bytes,
    ) catch return error.OutOfMemory;
    defer allocator.free(head);
    const lists = head[@sizeOf(JournalRecord)..];
    const rows: []u64 = @alignCast(std.mem.bytesAsSlice(u64, lists[0 .. k * 8]));
    for (rows, patches) |*row, patch| row.* = patch.row;
    @memcpy(lists[k * 8 ..][0 .. blocks.len * 8], std.mem.sliceAsBytes(blocks));
    @memcpy(lists[(k + blocks.len) * 8 ..][0 .. sums.len * 8], std.mem.sliceAsBytes(sums));
    var record = JournalRecord{
        .magic = format.journal_magic,
        .sequence = handle.last_sequence + 1,
        .base_generation = superblock.generation,
        .total_bytes = total,
        .row_bytes = stride,
        .row_count = k,
        .block_count = blocks.len,
        .tail_checksum = tail_checksum,
        .checksum = 0,
    };
    // `load`'s checks, on the writer's side: the header's lengths and padding.
    assert(record.bodyBytes().? == body_bytes and total - @sizeOf(JournalRecord) - body_bytes < 8);
    const outcome = blk: {
        handle.grow(total) catch |err| break :blk err;
        // The rows first, hashed as they go; then the header that makes
        // the record valid, whose checksum covers them.
        var hasher = record.checksumStart();
        hasher.update(lists);
        writeRows(
            handle,
            handle.end + head.len,
            patches,
            stride,
            total - head.len,
            &hasher,
        ) catch |err| break :blk err;
        record.checksum = hasher.final();
        @memcpy(head[0..@sizeOf(JournalRecord)], std.mem.asBytes(&record));
        io.write(handle.file, head, handle.end) catch |err| break :blk err;
        // A record larger than a step extended the file past `allocated`:
        // the next step must start after it, not write zeros over it.
        handle.allocated = @max(handle.allocated, handle.end + total);
        io.sync(handle.file) catch |err| {
            poisoned.* = true;
            break :blk err;
        };
        return total;
    };
    const blank = [_]u8{0} ** @sizeOf(JournalRecord);
    io.write(handle.file, &blank, handle.end) catch {};
    return outcome;
}

/// Rows that lie back to back in the caller's memory, this many bytes or
/// more, go to the journal from there (hashed as they go, their write-back
/// started so the record's fdatasync waits less), not through the stage.
const direct_bytes_min = 64 << 10;

/// Writes the staged bytes at `at.*`, hashed, and moves `at.*` past them.
fn flushStage(handle: *Handle, staged: []const u8, at: *u64, hasher: *std.hash.XxHash3) Error!void {
    assert(staged.len <= stage_bytes);
    if (staged.len == 0) return;
    hasher.update(staged);
    try io.write(handle.file, staged, at.*);
    at.* += staged.len;
}

/// Writes the patches' rows back to back at `offset`, then zeros up to
/// `bytes` (the record's padding), feeding the rows to `hasher`.
fn writeRows(
    handle: *Handle,
    offset: u64,
    patches: []const Patch,
    stride: u64,
    bytes: u64,
    hasher: *std.hash.XxHash3,
) Error!void {
    assert(bytes >= patches.len * stride and bytes - patches.len * stride < 8);
    const stage = allocator.alloc(u8, @min(bytes, stage_bytes)) catch return error.OutOfMemory;
    defer allocator.free(stage);
    var fill: u64 = 0;
    var at = offset;
    var k: usize = 0;
    while (k < patches.len) {
        const count = backToBack(patches[k..], stride);
        var rest = patches[k].bytes.ptr[0 .. count * stride];
        k += count;
        if (rest.len >= direct_bytes_min) {
            try flushStage(handle, stage[0..fill], &at, hasher);
            fill = 0;
            while (rest.len > 0) {
                const piece = rest[0..@min(rest.len, stage_bytes)];
                try flushStage(handle, piece, &at, hasher);
                rest = rest[piece.len..];
                // Only while hashing more rows follows to overlap it: the
                // record's fdatasync starts the last piece's write-back
                // as well, without a call of its own.
                if (rest.len > 0 or k < patches.len)
                    io.startWriteback(handle.file, at - piece.len, piece.len);
            }
            continue;
        }
        while (rest.len > 0) {
            const take = @min(rest.len, stage.len - fill);
            @memcpy(stage[fill..][0..take], rest[0..take]);
            fill += take;
            rest = rest[take..];
            if (fill == stage.len) {
                try flushStage(handle, stage, &at, hasher);
                fill = 0;
            }
        }
    }
    hasher.update(stage[0..fill]);
    const padding = offset + bytes - (at + fill);
    assert(padding < 8 and fill + padding <= stage.len);
    @memset(stage[fill..][0..padding], 0);
    fill += padding;
    if (fill > 0) try io.write(handle.file, stage[0..fill], at);
}

// ---- replay -------------------------------------------------------------------------

/// One record read back from the journal, checked before any field is used.
const Loaded = struct {
    record: JournalRecord,
    bytes: []align(8) u8,

    fn deinit(loaded: *Loaded) void {
        assert(loaded.bytes.len == loaded.record.total_bytes);
        allocator.free(loaded.bytes);
    }

    fn body(loaded: *const Loaded) []const u8 {
        assert(loaded.bytes.len >= @sizeOf(JournalRecord));
        return loaded.bytes[@sizeOf(JournalRecord)..];
    }

    fn list(loaded: *const Loaded, first: u64, count: u64) []const u64 {
        return @alignCast(std.mem.bytesAsSlice(u64, loaded.body()[first * 8 ..][0 .. count * 8]));
    }

    fn rows(loaded: *const Loaded) []const u64 {
        return loaded.list(0, loaded.record.row_count);
    }

    fn blocks(loaded: *const Loaded) []const u64 {
        return loaded.list(loaded.record.row_count, loaded.record.block_count);
    }

    fn sums(loaded: *const Loaded) []const u64 {
        return loaded.list(
            loaded.record.row_count + loaded.record.block_count,
            loaded.record.block_count,
        );
    }

    fn rowBytes(loaded: *const Loaded, k: usize) []const u8 {
        assert(k < loaded.record.row_count);
        const lists = (loaded.record.row_count + 2 * loaded.record.block_count) * 8;
        const stride = loaded.record.row_bytes;
        return loaded.body()[lists + k * stride ..][0..stride];
    }
};

/// The record at `offset` if it is the next one (`sequence`) of generation
/// `superblock` and whole; null at the end of the journal or a torn record.
fn load(
    file: io.File,
    file_bytes: u64,
    offset: u64,
    sequence: u64,
    superblock: *const Superblock,
) Error!?Loaded {
    if (offset + @sizeOf(JournalRecord) > file_bytes) return null;
    var record: JournalRecord = undefined;
    if (try io.read(file, std.mem.asBytes(&record), offset) != @sizeOf(JournalRecord)) return null;
    if (!isNext(&record, sequence, superblock)) return null;
    if (record.row_bytes != superblock.record_bytes or superblock.getLayout() != .fixed)
        return null;
    const body_bytes = record.bodyBytes() orelse return null;
    // Longer than the file is torn, as below, before `total` can overflow.
    if (body_bytes > file_bytes - offset) return null;
    const total = std.mem.alignForward(u64, @sizeOf(JournalRecord) +| body_bytes, 8);
    if (record.total_bytes != total or total > file_bytes - offset) return null;
    const bytes = allocator.alignedAlloc(u8, .@"8", total) catch return error.OutOfMemory;
    var loaded = Loaded{ .record = record, .bytes = bytes };
    errdefer loaded.deinit();
    if (try io.read(file, bytes, offset) != total) return null;
    const body = bytes[@sizeOf(JournalRecord)..][0..body_bytes];
    if (record.computeChecksum(body) != record.checksum) {
        loaded.deinit();
        return null;
    }
    assert(body.len == body_bytes and total - @sizeOf(JournalRecord) - body_bytes < 8);
    if (!sound(&loaded, superblock)) {
        loaded.deinit();
        return status.fail(
            error.Corrupt,
            "journal '{s}': record {d} passes its checksum but names rows or blocks outside the " ++
                "store",
            .{ file.name(), sequence },
        );
    }
    return loaded;
}

/// Rows and blocks strictly ascending and inside the store.
fn sound(loaded: *const Loaded, superblock: *const Superblock) bool {
    const full_blocks = superblock.data_bytes / block_bytes;
    // A writer journals at least one row of a store with rows of some
    // length (`writeRecord`); replay asserts that (`forEachRun`).
    if (loaded.record.row_count == 0 or superblock.record_bytes == 0) return false;
    for (loaded.rows(), 0..) |row, k| {
        if (row >= superblock.record_count) return false;
        if (k > 0 and row <= loaded.rows()[k - 1]) return false;
    }
    for (loaded.blocks(), 0..) |block, k| {
        if (block >= full_blocks) return false;
        if (k > 0 and block <= loaded.blocks()[k - 1]) return false;
    }
    return true;
}

/// Replays every record after `superblock`'s checkpoint into `target`, in
/// order. Returns how many it applied and the tail checksum after them.
pub const Replayed = struct { records: u64, tail_checksum: u64 };

pub fn replay(handle: *Handle, target: Target, superblock: *const Superblock) Error!Replayed {
    const file_bytes = try io.length(handle.file);
    const scratch = allocator.alloc(
        u8,
        run_blocks_max * block_bytes,
    ) catch return error.OutOfMemory;
    defer allocator.free(scratch);
    var offset: u64 = handle.start;
    var sequence = superblock.journal_sequence + 1;
    var tail_checksum = superblock.tail_checksum;
    var records: u64 = 0;
    // Bounded: each record moves `offset` forward by at least its header.
    while (try load(handle.file, file_bytes, offset, sequence, superblock)) |loaded_value| {
        var loaded = loaded_value;
        defer loaded.deinit();
        const patches = allocator.alloc(
            Patch,
            loaded.record.row_count,
        ) catch return error.OutOfMemory;
        defer allocator.free(patches);
        for (patches, loaded.rows(), 0..) |*patch, row, k| patch.* = .{
            .row = row,
            .bytes = loaded.rowBytes(k),
        };
        try apply(target, patches, loaded.blocks(), loaded.sums(), scratch);
        tail_checksum = loaded.record.tail_checksum;
        offset += loaded.record.total_bytes;
        sequence += 1;
        records += 1;
    }
    handle.end = offset;
    handle.last_sequence = sequence - 1;
    handle.invariant();
    // The reader's side of writeRecord's sequence: one per record, in order.
    assert(handle.last_sequence == superblock.journal_sequence + records);
    return .{ .records = records, .tail_checksum = tail_checksum };
}

/// Whether a reader that holds the lock has nothing to settle: the shared
/// page in `lock_file` is even and names `superblock`'s generation and tail
/// checksum, and the journal holds no record after the checkpoint. `settle`
/// would then rewrite the page with what it holds already, so the reader
/// skips it: reads only (also in a place that cannot be written), two
/// preads instead of the read-write opens, the page's mapping and its write
/// fault, which were half of a lazy load. False sends the reader down the
/// full path, which reports what is wrong, if anything is.
pub fn settledAlready(dir: io.Dir, lock_file: io.File, superblock: *const Superblock) Error!bool {
    var shared: JournalPage = undefined;
    if (try io.read(lock_file, std.mem.asBytes(&shared), 0) != @sizeOf(JournalPage)) return false;
    if (!std.mem.eql(u8, &shared.magic, &format.journal_magic)) return false;
    // No journal: the full path only puts a missing page back.
    if (superblock.journal_file == 0) return true;
    if (shared.sequence_lock % 2 != 0 or shared.tail_generation != superblock.generation or
        shared.tail_checksum != superblock.tail_checksum) return false;
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const file = io.openFile(
        dir,
        fileName(&name_buffer, superblock.journal_file),
        .read_only,
    ) catch return false;
    defer io.closeFile(file);
    // One read of the first page covers the version 2 header and the
    // first record's header; a short read is a damaged journal.
    var first: [page_bytes]u8 align(@alignOf(JournalRecord)) = undefined;
    if (try io.read(file, &first, 0) != page_bytes) return false;
    const header = std.mem.bytesToValue(JournalPage, first[0..@sizeOf(JournalPage)]);
    if (!std.mem.eql(u8, &header.magic, &format.journal_magic) or
        header.version != format.journal_version) return false;
    const start = format.journalRecordsStart(header.version);
    assert(start + @sizeOf(JournalRecord) <= first.len);
    const record = std.mem.bytesToValue(JournalRecord, first[start..][0..@sizeOf(JournalRecord)]);
    return !isNext(&record, superblock.journal_sequence + 1, superblock);
}

/// Whether the journal holds a record after the checkpoint, read through a
/// read-only handle (a store in a place that cannot be written).
pub fn pendingReadOnly(dir: io.Dir, superblock: *const Superblock) Error!bool {
    assert(superblock.journal_file != 0);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const file = try io.openFile(dir, fileName(&name_buffer, superblock.journal_file), .read_only);
    defer io.closeFile(file);
    const checked = try checkPage(dir, file);
    var loaded = try load(
        file,
        checked.length,
        checked.start,
        superblock.journal_sequence + 1,
        superblock,
    ) orelse return false;
    loaded.deinit();
    return true;
}

/// Opens `superblock`'s data and sums files read-write for a replay.
pub fn openTarget(dir: io.Dir, superblock: *const Superblock) Error!Target {
    assert(superblock.getLayout() == .fixed);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const data = try io.openFile(
        dir,
        format.fileName(&name_buffer, .data, superblock.data_file),
        .read_write,
    );
    errdefer io.closeFile(data);
    const sums = try io.openFile(
        dir,
        format.fileName(&name_buffer, .sums, superblock.sums_file),
        .read_write,
    );
    return .{
        .data = data,
        .sums = sums,
        .data_bytes = superblock.data_bytes,
        .stride = superblock.record_bytes,
    };
}

pub fn closeTarget(target: Target) void {
    io.closeFile(target.data);
    io.closeFile(target.sums);
}

/// The writer's target, kept open across replaces: the data and sums files
/// of the current fixed generation, reopened when a commit names others.
pub const OpenTarget = struct {
    target: ?Target = null,
    /// The data and sums files `target` is.
    ids: [2]u64 = .{ 0, 0 },

    pub fn get(open_target: *OpenTarget, dir: io.Dir, superblock: *const Superblock) Error!Target {
        assert(superblock.getLayout() == .fixed);
        if (open_target.target) |*target| {
            const ids = open_target.ids;
            if (ids[0] == superblock.data_file and ids[1] == superblock.sums_file) {
                target.data_bytes = superblock.data_bytes;
                target.stride = superblock.record_bytes;
                try cover(target);
                return target.*;
            }
            open_target.close();
        }
        open_target.target = try openTarget(dir, superblock);
        open_target.ids = .{ superblock.data_file, superblock.sums_file };
        try cover(&open_target.target.?);
        assert(open_target.target.?.stride == superblock.record_bytes);
        return open_target.target.?;
    }

    /// Maps both files (again, when appends grew the data past the
    /// mappings) with room for half as much again, so most appends need
    /// no new mapping.
    fn cover(target: *Target) Error!void {
        const sums_bytes = target.data_bytes / block_bytes * 8;
        if (target.maps) |maps| {
            if (target.data_bytes <= maps.data.len and sums_bytes <= maps.sums.len) return;
            maps.unmap();
            target.maps = null;
        }
        if (target.data_bytes == 0) return;
        const slack = 1 << 20;
        const data = try io.mapPatches(target.data, target.data_bytes * 3 / 2 + slack);
        errdefer io.unmapWritable(data);
        const sums = try io.mapPatches(target.sums, sums_bytes * 3 / 2 + slack);
        target.maps = .{ .data = data, .sums = sums };
        assert(target.data_bytes <= data.len and sums_bytes <= sums.len);
    }

    pub fn close(open_target: *OpenTarget) void {
        if (open_target.target) |target| {
            if (target.maps) |maps| maps.unmap();
            closeTarget(target);
        }
        open_target.target = null;
        assert(open_target.target == null);
    }
};

// ---- the readers' settle path ----------------------------------------------------

/// A reader that finds no live writer (the lock file free) applies the
/// journal records a killed writer left (they are committed), so it reads
/// what was committed.
pub fn settleReader(dir: io.Dir, superblock: *const Superblock) Error!void {
    assert(superblock.getLayout() == .fixed);
    const lock = io.openFile(dir, seqlock.lock_file_name, .read_only) catch |err| switch (err) {
        error.NotFound => return,
        else => return err,
    };
    defer io.closeFile(lock);
    if (!try io.tryLock(lock)) return;
    if (try settledAlready(dir, lock, superblock)) return;
    if (superblock.journal_file == 0) {
        // A power loss may have taken the shared page: put it back, if
        // this place can be written (otherwise no writer can come).
        const page_file = io.openFile(dir, seqlock.lock_file_name, .read_write) catch return;
        defer io.closeFile(page_file);
        return seqlock.ensureSharedPage(page_file);
    }
    var page_file: ?io.File = null;
    defer if (page_file) |file| io.closeFile(file);
    var memory: ?io.WritableMemory = null;
    defer if (memory) |mapped| io.unmapWritable(mapped);
    var handle = opened: {
        page_file = io.openFile(
            dir,
            seqlock.lock_file_name,
            .read_write,
        ) catch |err| break :opened err;
        memory = seqlock.mapPage(page_file.?) catch |err| break :opened err;
        break :opened open(dir, superblock, memory.?);
    } catch |err| {
        if (err == error.Corrupt or err == error.UnsupportedVersion) return err;
        if (try pendingReadOnly(dir, superblock)) {
            return status.fail(error.ReadOnly, "store '{s}' has replaces its last writer " ++
                "committed but did not finish applying, and this place cannot be written: " ++
                "open it once for writing where it can be written, which applies them", .{
                dir.path,
            });
        }
        return;
    };
    defer handle.close();
    _ = try settle(dir, &handle, superblock);
}

/// Waits while an in-place replace is writing (the sequence lock is odd);
/// returns the even value. A writer killed mid-replace leaves the lock odd:
/// `settler.settleStuck(page)` settles the journal once the lock file is
/// free, and says whether the lock is even then.
pub fn waitEven(dir: io.Dir, page: *const JournalPage, settler: anytype) Error!u64 {
    const wait_ns_max = 30 * std.time.ns_per_s;
    var waited_ns: u64 = 0;
    var spins: u32 = 0;
    while (true) {
        const value = seqlock.readBegin(page);
        if (value % 2 == 0) return value;
        spins += 1;
        if (spins < 1000) {
            std.atomic.spinLoopHint();
            continue;
        }
        if (waited_ns >= wait_ns_max) {
            return status.fail(error.Locked, "store '{s}': a writer has been replacing records " ++
                "in place for {d} s; is it stuck?", .{ dir.path, wait_ns_max / std.time.ns_per_s });
        }
        if (try settler.settleStuck(page)) continue;
        waited_ns += std.time.ns_per_ms;
    }
}

/// Replays `superblock`'s pending records under the sequence lock and
/// rewrites the shared page. Returns how many records it applied.
/// Without a record to replay (the usual case: every checkpoint covers every
/// record) it opens neither the data and sums files nor the replay scratch,
/// and only rewrites the shared page, so readers see the lock even and the
/// current generation's tail checksum.
pub fn settle(dir: io.Dir, handle: *Handle, superblock: *const Superblock) Error!Replayed {
    if (superblock.getLayout() != .fixed or !try mayHoldRecords(handle, superblock)) {
        assert(handle.end == handle.start and handle.last_sequence == superblock.journal_sequence);
        handle.lock();
        handle.unlock(superblock.generation, superblock.tail_checksum);
        return .{ .records = 0, .tail_checksum = superblock.tail_checksum };
    }
    const target = try openTarget(dir, superblock);
    defer closeTarget(target);
    handle.lock();
    var tail_checksum = superblock.tail_checksum;
    defer handle.unlock(superblock.generation, tail_checksum);
    const replayed = try replay(handle, target, superblock);
    tail_checksum = replayed.tail_checksum;
    return replayed;
}

test "runEnd: whole blocks covered back to back form their own runs, edges and sparse rows do not" {
    const testing = std.testing;
    const B = block_bytes;
    const memory = try allocator.alloc(u8, 40 << 20);
    defer allocator.free(memory);
    const patches = try allocator.alloc(Patch, 20_000);
    defer allocator.free(patches);
    const Case = struct {
        fn fill(
            out: []Patch,
            buffer: []const u8,
            first_row: u64,
            row_step: u64,
            stride: u64,
            count: usize,
        ) []Patch {
            for (out[0..count], 0..) |*patch, k| patch.* = .{
                .row = first_row + k * row_step,
                .bytes = buffer[k * stride ..][0..stride],
            };
            return out[0..count];
        }
        fn lastBlock(group: []const Patch, stride: u64) u64 {
            return (patchStart(group[group.len - 1], stride) + stride - 1) / block_bytes;
        }
    };
    // 10,000 rows of 40 B from row 5,000 (bytes 200,000..600,000): block 12
    // is an edge, 13..35 are whole, 36 is an edge.
    var group = Case.fill(patches, memory, 5_000, 1, 40, 10_000);
    var last = Case.lastBlock(group, 40);
    try testing.expectEqual(@as(u64, 36), last);
    try testing.expectEqual(@as(u64, 13), runEnd(group, 40, 12, last));
    try testing.expectEqual(@as(u64, 36), runEnd(group[(13 * B - 200_000) / 40 ..], 40, 13, last));
    try testing.expectEqual(@as(u64, 37), runEnd(group[(36 * B - 200_000) / 40 ..], 40, 36, last));
    // The same rows out of memory order (each row 80 B after the previous):
    // nothing is covered, one plain run.
    group = Case.fill(patches, memory, 5_000, 1, 40, 10_000);
    for (group, 0..) |*patch, k| patch.bytes = memory[k * 80 ..][0..40];
    try testing.expectEqual(@as(u64, 37), runEnd(group, 40, 12, last));
    // Sparse rows (one every 1,000, each its own group), back to back in
    // memory: a plain run.
    group = Case.fill(patches, memory, 0, 1_000, 40, 20_000);
    last = Case.lastBlock(group[0..1], 40);
    try testing.expectEqual(@as(u64, 1), runEnd(group, 40, 0, last));
    // Rows larger than a block, from block 0: all 25 blocks are whole.
    group = Case.fill(patches, memory, 0, 1, 40_960, 10);
    last = Case.lastBlock(group, 40_960);
    try testing.expectEqual(@as(u64, 24), last);
    try testing.expectEqual(@as(u64, 25), runEnd(group, 40_960, 0, last));
    // Three whole blocks between the edges are too few to split off.
    group = Case.fill(patches, memory, 400, 1, 40, 1_241); // bytes 16,000..65,640
    last = Case.lastBlock(group, 40);
    try testing.expectEqual(@as(u64, 4), last);
    try testing.expectEqual(@as(u64, 5), runEnd(group, 40, 0, last));
    // Four are enough.
    group = Case.fill(patches, memory, 400, 1, 40, 1_700); // bytes 16,000..84,000
    try testing.expectEqual(@as(u64, 1), runEnd(group, 40, 0, Case.lastBlock(group, 40)));
    // A long run of whole blocks is cut every 64 blocks.
    group = Case.fill(patches, memory, 0, 1, 2_000, 20_000); // 40 MB from block 0
    last = Case.lastBlock(group, 2_000);
    try testing.expectEqual(@as(u64, 64), runEnd(group, 2_000, 0, last));
    try testing.expectEqual(@as(u64, 128), runEnd(group[(64 * B) / 2_000 ..], 2_000, 64, last));
}
