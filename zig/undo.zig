//! The undo area of a durable=False fixed store: in-place replaces with no
//! barrier per replace, keeping the promise that a power loss opens the
//! store at its last sync (or a later state whose bytes were all checked).
//!
//! The first time a sync interval (the time from one durable commit to the
//! next) touches a 16 KiB block, the block's synced image and its checksum
//! go to the file `undo` as a checksummed record naming the synced
//! generation; one fdatasync covers every block a replace touches first,
//! and `ahead_blocks` more unsaved blocks after them (see there). Only then
//! are the rows patched into the data and sums files, unsynced. Later
//! replaces of blocks already saved write no record and sync nothing.
//! Any commit of an interval that saved blocks is durable (data and sums
//! synced, then the superblock): a new generation, and the records, which
//! name the old one, are dead. Recovery (a writer's begin, a reader that
//! finds no live writer) writes back every valid record of the opened
//! generation, syncs the data and sums files, and (a writer) commits a new
//! generation, so the store opens at its last sync, through a power loss or
//! a process kill alike.
//!
//! Invariant: a block's committed bytes change in place only after a
//! durable record holds its synced image for the current generation; the
//! records are dropped only by a durable commit of a newer generation.
const std = @import("std");
const builtin = @import("builtin");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const journal = @import("journal.zig");
const seqlock = @import("seqlock.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Superblock = format.Superblock;
const Patch = @import("plans.zig").Patch;
const Snapshot = @import("snapshot.zig").Snapshot;
const block_bytes = format.block_bytes;

pub const file_name = "undo";
const record_magic = "ZUNDOREC".*;
const range_magic = "ZUNDORNG".*;

/// One saved block (`record_magic`) or range (`range_magic`): this header,
/// then `image_bytes` of the bytes it saves, zero-padded to 8 bytes.
///
/// A block record holds a block's whole image; a range record holds the
/// bytes of part of one block (a replace's rows, where saving them costs
/// far less than their blocks: `range_blocks_min`). A range's block is not
/// marked saved, so a later replace of it saves it again, and that record
/// may hold bytes the interval patched: recovery writes the records back
/// newest first, so the oldest record of each byte, taken before any patch
/// of it (the invariant), has the last word.
const Record = extern struct {
    magic: [8]u8,
    /// The synced generation the image belongs to.
    generation: u64,
    /// A block record: the block's index; a range record: the data byte
    /// offset of its first byte.
    place: u64,
    image_bytes: u64,
    /// The block's checksum when it was saved (the tail's, for the partial
    /// last block: the superblock holds it, so recovery writes none).
    sum: u64,
    checksum: u64,

    fn compute(record: *const Record, image: []const u8) u64 {
        var hasher = std.hash.XxHash3.init(0x756e646f_7265636f);
        hasher.update(std.mem.asBytes(record)[0 .. @sizeOf(Record) - 8]);
        hasher.update(image);
        return hasher.final();
    }
};

comptime {
    assert(@sizeOf(Record) == 48);
}

fn recordBytes(image_bytes: u64) u64 {
    return @sizeOf(Record) + std.mem.alignForward(u64, image_bytes, 8);
}

fn isRecord(record: *const Record) bool {
    return std.mem.eql(u8, &record.magic, &record_magic) or
        std.mem.eql(u8, &record.magic, &range_magic);
}

/// Breaks on purpose, for the simulator to show that it catches each one
/// (tests only; LOADERX_SIM_BREAK names one).
pub const Sabotage = enum {
    none,
    skip_undo_sync,
    patch_before_undo,
    any_generation,
    skip_replay,
    unsynced_commit_after_undo,
    skip_dir_sync,
    restore_oldest_first,
    row_ends_only,
};
pub var sabotage: Sabotage = .none;

fn broken(kind: Sabotage) bool {
    return builtin.is_test and sabotage == kind;
}

/// The geometry of a fixed store's blocks: `full` whole blocks, then a
/// partial last block of `tail_bytes` (0: none) with index `full`.
const Geometry = struct {
    full: u64,
    tail_bytes: u64,

    fn of(superblock: *const Superblock) Geometry {
        return .{
            .full = superblock.data_bytes / block_bytes,
            .tail_bytes = superblock.data_bytes % block_bytes,
        };
    }

    fn imageBytes(geometry: Geometry, block: u64) ?u64 {
        if (block < geometry.full) return block_bytes;
        if (block == geometry.full and geometry.tail_bytes > 0) return geometry.tail_bytes;
        return null;
    }

    fn dataBytes(geometry: Geometry) u64 {
        return geometry.full * block_bytes + geometry.tail_bytes;
    }

    /// The data byte offset a record's image goes to, or null when the
    /// record does not fit this geometry (a block record of another
    /// block's size, a range past the data or across a block edge).
    fn placeOf(geometry: Geometry, record: *const Record) ?u64 {
        if (std.mem.eql(u8, &record.magic, &record_magic)) {
            const expected = geometry.imageBytes(record.place) orelse return null;
            if (record.image_bytes != expected) return null;
            return record.place * block_bytes;
        }
        const bytes = record.image_bytes;
        if (bytes == 0 or bytes > block_bytes or record.place >= geometry.dataBytes() or
            bytes > geometry.dataBytes() - record.place) return null;
        if (record.place / block_bytes != (record.place + bytes - 1) / block_bytes) return null;
        return record.place;
    }
};

/// Unsaved blocks a barrier saves beyond the ones its replace touches: the
/// blocks after them (from the last, wrapping around), at most 1 MiB; the
/// k-th barrier of an interval saves 2^(k-1) - 1 of them (up to that), so
/// an interval's first edit pays what it did before. Without them
/// single-row edits of scattered blocks paid an fdatasync each (1,000 of
/// them 0.9 s where numpack's unsynced writes took 13 ms). With them a
/// sync interval's barriers stop once every block is saved, and each costs
/// its fdatasync plus about as much again in bytes written (an fdatasync
/// of a small write costs about what writing 1 MiB more does): at most
/// twice what saving only the touched blocks costs, as in ski rental.
/// Saving a block nothing then changes is harmless: recovery writes back
/// its synced image, the bytes it holds.
pub const ahead_blocks = 64;
/// Blocks the search for unsaved ones looks at, per barrier.
const ahead_scan_max = 64 * ahead_blocks;

/// A replace that finds at least this many of its blocks unsaved, whose
/// range records take under a quarter of those blocks' bytes, saves the
/// ranges of its rows instead of the blocks: 1,000 scattered 40-byte rows
/// save 88 KB, not 16 MB. Fewer blocks keep block records, which later
/// replaces of the same blocks reuse. A variable so the simulator can
/// lower it to its small stores.
pub var range_blocks_min: u64 = 64;

/// The writer's undo area.
pub const Undo = struct {
    file: ?io.File = null,
    /// The interval's records are durable and blocks were patched: the next
    /// commit must be durable (`commit.prepare`), and ends the interval.
    active: bool = false,
    /// The synced generation the interval saves blocks of.
    generation: u64 = 0,
    /// Where the next record goes.
    end: u64 = 0,
    /// Blocks saved in this interval (the tail block is index `full`).
    saved: std.DynamicBitSetUnmanaged = .{},
    /// Rows saved in this interval as range records (in blocks not saved):
    /// later replaces of them need no record.
    saved_rows: std.AutoHashMapUnmanaged(u64, void) = .empty,
    /// The interval's barriers so far (fdatasyncs of records).
    barriers: u32 = 0,
    /// The replaces' 1 MiB of scratch, kept: allocated per call, glibc
    /// mapped and faulted it in each time (0.1 ms of a 1-row replace).
    scratch: ?[]u8 = null,

    pub fn close(undo: *Undo) void {
        if (undo.file) |file| io.closeFile(file);
        undo.file = null;
        undo.saved.deinit(allocator);
        undo.saved_rows.deinit(allocator);
        if (undo.scratch) |scratch| allocator.free(scratch);
        undo.* = .{};
    }

    fn scratchBuffer(undo: *Undo) Error![]u8 {
        if (undo.scratch == null) {
            undo.scratch = allocator.alloc(
                u8,
                journal.run_blocks_max * block_bytes,
            ) catch return error.OutOfMemory;
        }
        return undo.scratch.?;
    }

    /// A durable commit of a newer generation made the records dead.
    pub fn retire(undo: *Undo) void {
        undo.active = false;
        undo.end = 0;
        assert(!undo.active);
    }

    /// Deletes the file of dead records (at close, once retired): an idle
    /// store holds only the files its superblock names. Its unlink needs no
    /// sync: the records name an older generation.
    pub fn trim(undo: *Undo, dir: io.Dir) void {
        assert(!undo.active);
        const file = undo.file orelse return;
        io.closeFile(file);
        undo.file = null;
        io.unlink(dir, file_name) catch {};
    }

    fn begin(undo: *Undo, superblock: *const Superblock) Error!void {
        if (undo.active and undo.generation == superblock.generation) return;
        const geometry = Geometry.of(superblock);
        undo.saved.resize(allocator, geometry.full + 1, false) catch return error.OutOfMemory;
        undo.saved.unsetAll();
        undo.saved_rows.clearRetainingCapacity();
        undo.generation = superblock.generation;
        undo.end = 0;
        undo.barriers = 0;
        undo.active = false;
    }

    /// The file, created (and its name made durable) on first use.
    fn ensureFile(undo: *Undo, dir: io.Dir) Error!io.File {
        if (undo.file) |file| return file;
        const file = try io.createFile(dir, file_name, false);
        errdefer io.closeFile(file);
        // Once per writer: a file a killed writer created may not be
        // durable in its directory yet.
        if (!broken(.skip_dir_sync)) try io.syncDir(dir);
        undo.file = file;
        return file;
    }

    /// Saves what a replace of `patches` will change that this interval
    /// has not saved: the blocks its runs touch (`sums`, and the tail block
    /// when they reach it), or the ranges of its rows (`range_blocks_min`).
    fn protectTouched(
        undo: *Undo,
        dir: io.Dir,
        target: journal.Target,
        superblock: *const Superblock,
        patches: []const Patch,
        committed: *const Snapshot,
        sums: *const journal.Sums,
        poisoned: *bool,
    ) Error!void {
        try undo.begin(superblock);
        const tail = sums.tail_checksum != null;
        const geometry = Geometry.of(superblock);
        var fresh: u64 = @intFromBool(tail and !undo.saved.isSet(geometry.full));
        for (sums.blocks.items) |block| fresh += @intFromBool(!undo.saved.isSet(block));
        if (fresh == 0) {
            assert(undo.active);
            return; // every block saved
        }
        // The rows of unsaved blocks that no range record holds yet.
        var unsaved_rows: u64 = 0;
        for (patches) |patch| {
            unsaved_rows += @intFromBool(undo.rowUnsaved(patch.row, target.stride));
        }
        if (unsaved_rows == 0) {
            assert(undo.active);
            return; // saved as ranges earlier in the interval
        }
        // A record per block a row lies in: at most one more than its whole blocks.
        const pieces = target.stride / block_bytes + 2;
        const range_bytes = unsaved_rows * (recordBytes(target.stride) + pieces * @sizeOf(Record));
        if (fresh >= range_blocks_min and range_bytes * 4 < fresh * block_bytes) {
            return undo.protectRanges(dir, target, superblock, patches, committed, poisoned);
        }
        try undo.protect(dir, target, superblock, sums.blocks.items, tail, poisoned);
    }

    /// Whether a replace of `row` needs a record: some block it lies in is
    /// unsaved (a row wider than a block lies in more than two), and no
    /// range record of the interval holds it.
    fn rowUnsaved(undo: *const Undo, row: u64, stride: u64) bool {
        const first = row * stride / block_bytes;
        const last = (row * stride + stride - 1) / block_bytes;
        for (first..last + 1) |block| {
            // The sabotage looks at the row's end blocks only.
            if (broken(.row_ends_only) and block != first and block != last) continue;
            if (!undo.saved.isSet(block)) return !undo.saved_rows.contains(row);
        }
        return false;
    }

    /// Makes the current bytes of each row of `patches` in a block this
    /// interval has not saved durable in the undo area as range records
    /// (one per row and block), read from the writer's mappings. The blocks
    /// stay unsaved, the rows are marked saved. One fdatasync.
    fn protectRanges(
        undo: *Undo,
        dir: io.Dir,
        target: journal.Target,
        superblock: *const Superblock,
        patches: []const Patch,
        committed: *const Snapshot,
        poisoned: *bool,
    ) Error!void {
        const geometry = Geometry.of(superblock);
        const data = committed.dataBytes();
        const block_sums = committed.blockSums();
        assert(data.len == geometry.dataBytes() and block_sums.len == geometry.full);
        const stride = target.stride;
        const buffer_bytes = journal.run_blocks_max * recordBytes(block_bytes);
        const buffer = allocator.alignedAlloc(u8, .@"8", buffer_bytes) catch
            return error.OutOfMemory;
        defer allocator.free(buffer);
        const file = try undo.ensureFile(dir);
        var at = undo.end;
        var fill: usize = 0;
        // Marked saved once the records are durable; the hash map's room
        // first, so marking them cannot fail.
        undo.saved_rows.ensureUnusedCapacity(allocator, @intCast(patches.len)) catch
            return error.OutOfMemory;
        for (patches) |patch| {
            if (!undo.rowUnsaved(patch.row, stride)) continue;
            const end = patch.row * stride + stride;
            assert(end <= data.len);
            var start = patch.row * stride;
            while (start < end) {
                const block = start / block_bytes;
                const piece_end = @min(end, (block + 1) * block_bytes);
                defer start = piece_end;
                if (undo.saved.isSet(block)) continue;
                const image = data[start..piece_end];
                if (fill + recordBytes(image.len) > buffer.len) {
                    try io.write(file, buffer[0..fill], at);
                    at += fill;
                    fill = 0;
                }
                const tail_sum = superblock.tail_checksum;
                const sum = if (block < geometry.full) block_sums[block] else tail_sum;
                fill += layRecord(buffer[fill..], range_magic, superblock, start, image, sum);
            }
        }
        // `protectTouched` found a block unsaved, so some row lies in it.
        assert(fill > 0 or at > undo.end);
        try io.write(file, buffer[0..fill], at);
        try undo.seal(file, at + fill, poisoned);
        for (patches) |patch| undo.saved_rows.putAssumeCapacity(patch.row, {});
    }

    /// The barrier: makes the records written up to `at` durable, then the
    /// interval's. A failed sync poisons the writer: its records may be
    /// durable in part, and it cannot tell which.
    fn seal(undo: *Undo, file: io.File, at: u64, poisoned: *bool) Error!void {
        assert(at > undo.end);
        if (!broken(.skip_undo_sync)) io.sync(file) catch |err| {
            poisoned.* = true;
            return err;
        };
        undo.end = at;
        undo.barriers +|= 1;
        undo.active = true;
    }

    /// Makes the synced image of every block in `blocks` (whole blocks,
    /// ascending) and of the tail block (`tail`) durable in the undo area,
    /// unless this interval saved it already. One fdatasync, or none.
    pub fn protect(
        undo: *Undo,
        dir: io.Dir,
        target: journal.Target,
        superblock: *const Superblock,
        blocks: []const u64,
        tail: bool,
        poisoned: *bool,
    ) Error!void {
        try undo.begin(superblock);
        const geometry = Geometry.of(superblock);
        var fresh: std.ArrayList(u64) = .empty;
        defer fresh.deinit(allocator);
        for (blocks) |block| {
            assert(block < geometry.full);
            if (!undo.saved.isSet(block))
                fresh.append(allocator, block) catch return error.OutOfMemory;
        }
        if (tail and !undo.saved.isSet(geometry.full))
            fresh.append(allocator, geometry.full) catch return error.OutOfMemory;
        if (fresh.items.len == 0) {
            assert(undo.active);
            return;
        }
        for (fresh.items) |block| undo.saved.set(block);
        errdefer for (fresh.items) |block| undo.saved.unset(block);
        try undo.addAhead(&fresh, geometry);
        const file = try undo.ensureFile(dir);
        const chunk_blocks = journal.run_blocks_max;
        const buffer = allocator.alignedAlloc(
            u8,
            .@"8",
            chunk_blocks * recordBytes(block_bytes),
        ) catch return error.OutOfMemory;
        defer allocator.free(buffer);
        var at = undo.end;
        var k: usize = 0;
        while (k < fresh.items.len) {
            var fill: usize = 0;
            const chunk_end = @min(fresh.items.len, k + chunk_blocks);
            while (k < chunk_end) : (k += 1) {
                fill += try saveBlock(target, superblock, fresh.items[k], buffer[fill..]);
            }
            try io.write(file, buffer[0..fill], at);
            at += fill;
        }
        try undo.seal(file, at, poisoned);
        assert(undo.generation == superblock.generation);
    }

    /// Appends to `fresh` (the blocks a barrier saves, marked saved) the
    /// unsaved blocks after its last that this barrier saves ahead, marking
    /// them saved too.
    fn addAhead(undo: *Undo, fresh: *std.ArrayList(u64), geometry: Geometry) Error!void {
        const slots = geometry.full + @intFromBool(geometry.tail_bytes > 0);
        assert(fresh.items.len > 0 and slots > 0);
        const shift: u6 = @intCast(@min(undo.barriers, 7));
        const ahead = @min(ahead_blocks, (@as(u64, 1) << shift) - 1);
        var block = fresh.items[fresh.items.len - 1];
        var added: usize = 0;
        for (0..@min(slots, ahead_scan_max)) |_| {
            if (added == ahead) break;
            block = if (block + 1 < slots) block + 1 else 0;
            if (undo.saved.isSet(block)) continue;
            fresh.append(allocator, block) catch return error.OutOfMemory;
            undo.saved.set(block);
            added += 1;
        }
    }
};

/// Lays block `block`'s record (its synced image, read from `target`) at
/// the start of `out`; returns its length.
fn saveBlock(
    target: journal.Target,
    superblock: *const Superblock,
    block: u64,
    out: []u8,
) Error!u64 {
    const geometry = Geometry.of(superblock);
    const image_bytes = geometry.imageBytes(block).?;
    const padded = recordBytes(image_bytes);
    assert(out.len >= padded);
    const image = out[@sizeOf(Record)..][0..image_bytes];
    if (try io.read(target.data, image, block * block_bytes) != image_bytes) {
        return status.fail(
            error.Corrupt,
            "data file '{s}' is shorter than committed",
            .{target.data.name()},
        );
    }
    var sum = superblock.tail_checksum;
    if (block < geometry.full) {
        if (try io.read(target.sums, std.mem.asBytes(&sum), block * 8) != 8) {
            return status.fail(
                error.Corrupt,
                "sums file '{s}' is shorter than committed",
                .{target.sums.name()},
            );
        }
    }
    return layRecord(out, record_magic, superblock, block, image, sum);
}

/// Lays a record of `image` (which may already lie in place, after the
/// header) at the start of `out`; returns its length.
fn layRecord(
    out: []u8,
    magic: [8]u8,
    superblock: *const Superblock,
    place: u64,
    image: []const u8,
    sum: u64,
) u64 {
    const padded = recordBytes(image.len);
    assert(out.len >= padded);
    const body = out[@sizeOf(Record)..][0..image.len];
    if (body.ptr != image.ptr) @memcpy(body, image);
    @memset(out[@sizeOf(Record) + image.len .. padded], 0);
    var record = Record{
        .magic = magic,
        .generation = superblock.generation,
        .place = place,
        .image_bytes = image.len,
        .sum = sum,
        .checksum = 0,
    };
    record.checksum = record.compute(body);
    @memcpy(out[0..@sizeOf(Record)], std.mem.asBytes(&record));
    return padded;
}

/// An in-place replace of `patches` (ascending, unique rows) with no
/// barrier once its blocks are saved (`Undo.protect`). Returns the new tail
/// checksum. A failure after the first byte changed sets `poisoned`: the
/// reopening writer restores the last sync.
pub fn replace(
    undo: *Undo,
    dir: io.Dir,
    target: journal.Target,
    superblock: *const Superblock,
    patches: []const Patch,
    committed: *const Snapshot,
    page: io.WritableMemory,
    threads: u32,
    poisoned: *bool,
) Error!u64 {
    assert(patches.len > 0 and target.stride == superblock.record_bytes);
    assert(superblock.unsynced == 0);
    const scratch = try undo.scratchBuffer();
    var sums = journal.Sums{};
    defer sums.deinit();
    try journal.computeSums(target, patches, scratch, committed, threads, &sums);
    assert(sums.runs > 0 and sums.blocks.items.len == sums.sums.items.len);
    const tail_checksum = sums.tail_checksum orelse committed.tailChecksum();
    // The break hook moves the save after the patch; the save is the same.
    const save_first = !broken(.patch_before_undo);
    if (save_first)
        try undo.protectTouched(dir, target, superblock, patches, committed, &sums, poisoned);
    seqlock.lockPage(page);
    defer seqlock.unlockPage(page, superblock.generation, tail_checksum);
    journal.applyLive(&target, patches, &sums, scratch) catch |err| {
        poisoned.* = true;
        return status.wrap(
            err,
            "an unsynced in-place replace failed half way; close the store and open it " ++
                "again, which restores it to its last sync()",
            .{},
        );
    };
    if (!save_first)
        try undo.protectTouched(dir, target, superblock, patches, committed, &sums, poisoned);
    return tail_checksum;
}

/// Deletes an undo file whose records are dead (none names `superblock`'s
/// generation), which a writer that stopped left: called by a writer, under
/// its lock, at its start.
pub fn removeStale(dir: io.Dir, superblock: *const Superblock) Error!void {
    if (!io.exists(dir, file_name) or try pending(dir, superblock)) return;
    // Pending is false for another layout too: no undo file belongs to it.
    try io.unlink(dir, file_name);
}

/// The first record of the undo area, if it names `superblock`'s
/// generation: then the data may hold unsynced patches to restore.
pub fn pending(dir: io.Dir, superblock: *const Superblock) Error!bool {
    if (superblock.getLayout() != .fixed or !io.exists(dir, file_name)) return false;
    const file = io.openFile(dir, file_name, .read_only) catch |err| switch (err) {
        error.NotFound => return false,
        else => return err,
    };
    defer io.closeFile(file);
    var record: Record = undefined;
    if (try io.read(file, std.mem.asBytes(&record), 0) != @sizeOf(Record)) return false;
    return isRecord(&record) and
        (record.generation == superblock.generation or broken(.any_generation));
}

/// Writes back every valid record of `superblock`'s generation into
/// `target`, newest first (see `Record`), under the sequence lock of
/// `page`, syncs the data and sums files, and names the generation's tail
/// checksum in the page. Returns whether it restored anything; idempotent.
pub fn restore(
    dir: io.Dir,
    target: journal.Target,
    superblock: *const Superblock,
    page: io.WritableMemory,
) Error!bool {
    if (broken(.skip_replay)) return false;
    if (!try pending(dir, superblock)) return false;
    const file = try io.openFile(dir, file_name, .read_only);
    defer io.closeFile(file);
    const file_bytes = try io.length(file);
    const geometry = Geometry.of(superblock);
    const image = allocator.alloc(u8, block_bytes) catch return error.OutOfMemory;
    defer allocator.free(image);
    // The valid records: every one up to the first that is not.
    var valid: std.ArrayList(u64) = .empty;
    defer valid.deinit(allocator);
    var offset: u64 = 0;
    // Bounded: each record moves `offset` forward by at least its header.
    while (offset + @sizeOf(Record) <= file_bytes) {
        const record = try readRecord(file, offset, file_bytes, geometry, superblock, image) orelse
            break;
        valid.append(allocator, offset) catch return error.OutOfMemory;
        offset += recordBytes(record.image_bytes);
    }
    if (valid.items.len == 0) return false;
    seqlock.lockPage(page);
    defer seqlock.unlockPage(page, superblock.generation, superblock.tail_checksum);
    for (0..valid.items.len) |k| {
        const newest_first = valid.items.len - 1 - k;
        const at = valid.items[if (broken(.restore_oldest_first)) k else newest_first];
        // Read again: the file did not change since (no writer runs).
        const record = (try readRecord(file, at, file_bytes, geometry, superblock, image)).?;
        const place = geometry.placeOf(&record).?;
        try io.write(target.data, image[0..record.image_bytes], place);
        const block = place / block_bytes;
        if (block < geometry.full) {
            try io.write(target.sums, std.mem.asBytes(&record.sum), block * 8);
        }
    }
    try io.sync(target.data);
    try io.sync(target.sums);
    return true;
}

/// The record at `offset` with its image in `image`, or null when it is
/// not a whole, valid record of `superblock`'s generation that fits.
fn readRecord(
    file: io.File,
    offset: u64,
    file_bytes: u64,
    geometry: Geometry,
    superblock: *const Superblock,
    image: []u8,
) Error!?Record {
    assert(image.len == block_bytes);
    var record: Record = undefined;
    if (try io.read(file, std.mem.asBytes(&record), offset) != @sizeOf(Record)) return null;
    if (!isRecord(&record)) return null;
    if (record.generation != superblock.generation and !broken(.any_generation)) return null;
    _ = geometry.placeOf(&record) orelse return null;
    if (recordBytes(record.image_bytes) > file_bytes - offset) return null;
    const bytes = image[0..record.image_bytes];
    if (try io.read(file, bytes, offset + @sizeOf(Record)) != bytes.len) return null;
    if (record.compute(bytes) != record.checksum) return null;
    return record;
}

/// A reader that finds no live writer (it holds the lock file) restores
/// what a writer that stopped mid-interval left, so it reads the last sync.
pub fn settleReader(dir: io.Dir, superblock: *const Superblock) Error!void {
    if (!try pending(dir, superblock)) return;
    const lock = io.openFile(dir, seqlock.lock_file_name, .read_only) catch |err| switch (err) {
        error.NotFound => return,
        else => return err,
    };
    defer io.closeFile(lock);
    // A live writer restores nothing: its records are its interval's.
    if (!try io.tryLock(lock)) return;
    const page_file = io.openFile(dir, seqlock.lock_file_name, .read_write) catch |err| {
        return status.wrap(err, "store '{s}' holds in-place replaces its last writer did " ++
            "not sync, and this place cannot be written: open it once for writing where it " ++
            "can be written, which restores its last sync", .{dir.path});
    };
    defer io.closeFile(page_file);
    const memory = try seqlock.mapPage(page_file);
    defer io.unmapWritable(memory);
    const target = try journal.openTarget(dir, superblock);
    defer journal.closeTarget(target);
    _ = try restore(dir, target, superblock, memory);
}
