//! Rewrite plans: where each row of a rewritten file comes from (a replace,
//! a delete in either order, the fixed-to-indexed conversion), and the
//! buffered writer that streams the rows into a new file.
//!
//! Invariant: a plan hands out exactly `row_count` rows of `stride` bytes,
//! in order, each from the old file or from the caller's new rows; the old
//! file is read through the committed snapshot and never written.
const std = @import("std");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const Snapshot = @import("snapshot.zig").Snapshot;

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Entry = format.Entry;
const block_bytes = format.block_bytes;

/// Writes `row_count` rows of `stride` bytes from `plan` into `file`,
/// with block checksums into `sums_file` when given.
pub fn streamRows(
    file: io.File,
    sums_file: ?io.File,
    row_count: u64,
    stride: u64,
    plan: anytype,
) Error!RowWriter.Written {
    var writer = try RowWriter.init(file, sums_file);
    defer writer.deinit();
    var cursor = plan.begin();
    // A plan hands out runs of consecutive rows (one memcpy per run of
    // untouched rows), but no more than the rows left.
    var row: u64 = 0;
    while (row < row_count) {
        const bytes = cursor.next(row, row_count - row);
        const rows = if (stride == 0) row_count - row else bytes.len / stride;
        assert(rows >= 1 and rows <= row_count - row);
        assert(bytes.len == rows * stride);
        try writer.write(bytes);
        row += rows;
    }
    assert(row == row_count);
    const written = try writer.finish();
    // The file holds exactly the rows: what the superblock will name.
    assert(written.bytes == row_count * stride);
    return written;
}

// ---- rewrite plans: where each row of a rewritten file comes from ---------------

pub const Patch = struct {
    row: u64,
    bytes: []const u8,

    pub fn lessThan(_: void, a: Patch, b: Patch) bool {
        return a.row < b.row;
    }
};

/// Row i is the patch for row i if there is one, else old row i.
pub const PatchPlan = struct {
    old: []const u8,
    stride: u64,
    patches: []const Patch,

    const Cursor = struct {
        plan: *const PatchPlan,
        next_patch: usize = 0,

        /// Rows from `row` on: one patch, or the old rows up to the next patch.
        pub fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            assert(rows_max >= 1);
            const patches = cursor.plan.patches;
            var run = rows_max;
            if (cursor.next_patch < patches.len) {
                const patch = patches[cursor.next_patch];
                if (patch.row == row) {
                    cursor.next_patch += 1;
                    assert(patch.bytes.len == cursor.plan.stride);
                    return patch.bytes;
                }
                assert(patch.row > row);
                run = @min(run, patch.row - row);
            }
            const stride = cursor.plan.stride;
            return cursor.plan.old[row * stride ..][0 .. run * stride];
        }
    };

    pub fn begin(plan: *const PatchPlan) Cursor {
        // The cursor walks the patches once, in row order.
        assert(std.sort.isSorted(Patch, plan.patches, {}, Patch.lessThan));
        return .{ .plan = plan };
    }
};

/// The rows that survive a delete: in order (keep_order), or with the tail's
/// survivors moved into the holes below the new end.
pub const DeletePlan = struct {
    old: []const u8,
    stride: u64,
    doomed: []const u64,
    remaining: u64,
    keep_order: bool,

    pub fn init(snapshot: *const Snapshot, doomed: []const u64, keep_order: bool) DeletePlan {
        // The caller checked and deduplicated the indices: each row once,
        // in order, within the store.
        assert(strictlyAscending(doomed));
        assert(doomed.len == 0 or doomed[doomed.len - 1] < snapshot.count());
        const fixed = snapshot.layout() == .fixed;
        return .{
            .old = if (fixed) snapshot.dataBytes() else std.mem.sliceAsBytes(snapshot.entries()),
            .stride = if (fixed) snapshot.superblock.record_bytes else @sizeOf(Entry),
            .doomed = doomed,
            .remaining = snapshot.count() - doomed.len,
            .keep_order = keep_order,
        };
    }

    const Cursor = struct {
        plan: *const DeletePlan,
        /// keep_order: next old row to consider. Otherwise: next tail row.
        old_row: u64,
        /// Next doomed index not yet passed.
        doomed_next: usize = 0,
        /// Tail mode: next doomed index at or past the new end.
        tail_doomed: usize,

        /// Rows from `row` on: survivors up to the next deleted row
        /// (keep_order), or one tail row for a hole, or the rows up to the
        /// next hole.
        pub fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            assert(rows_max >= 1);
            const plan = cursor.plan;
            const doomed = plan.doomed;
            if (plan.keep_order) {
                while (cursor.doomed_next < doomed.len and
                    doomed[cursor.doomed_next] == cursor.old_row)
                {
                    cursor.doomed_next += 1;
                    cursor.old_row += 1;
                }
                var run = rows_max;
                if (cursor.doomed_next < doomed.len) run = @min(
                    run,
                    doomed[cursor.doomed_next] - cursor.old_row,
                );
                cursor.old_row += run;
                return plan.oldRows(cursor.old_row - run, run);
            }
            const is_hole = cursor.doomed_next < doomed.len and doomed[cursor.doomed_next] == row;
            if (!is_hole) {
                var run = rows_max;
                if (cursor.doomed_next < doomed.len) run = @min(
                    run,
                    doomed[cursor.doomed_next] - row,
                );
                return plan.oldRows(row, run);
            }
            cursor.doomed_next += 1;
            // The next survivor in the tail: skip tail rows that are doomed too.
            while (cursor.tail_doomed < doomed.len and
                doomed[cursor.tail_doomed] == cursor.old_row)
            {
                cursor.tail_doomed += 1;
                cursor.old_row += 1;
            }
            cursor.old_row += 1;
            return plan.oldRows(cursor.old_row - 1, 1);
        }
    };

    fn oldRows(plan: *const DeletePlan, old_row: u64, rows: u64) []const u8 {
        assert(rows >= 1);
        assert((old_row + rows) * plan.stride <= plan.old.len);
        return plan.old[old_row * plan.stride ..][0 .. rows * plan.stride];
    }

    pub fn begin(plan: *const DeletePlan) Cursor {
        const first_tail = std.sort.lowerBound(u64, plan.doomed, plan.remaining, orderU64);
        assert(first_tail <= plan.doomed.len);
        return .{
            .plan = plan,
            .old_row = if (plan.keep_order) 0 else plan.remaining,
            .tail_doomed = first_tail,
        };
    }
};

fn orderU64(context: u64, item: u64) std.math.Order {
    return std.math.order(context, item);
}

fn strictlyAscending(items: []const u64) bool {
    if (items.len < 2) return true;
    for (items[0 .. items.len - 1], items[1..]) |before, after| {
        if (before >= after) return false;
    }
    return true;
}

/// Entries for the records of a fixed store, checksummed from its data.
pub const ConvertPlan = struct {
    old: []const u8,
    stride: u64,

    const Cursor = struct {
        plan: *const ConvertPlan,
        entry: Entry = undefined,

        pub fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            assert(rows_max >= 1);
            const stride = cursor.plan.stride;
            assert((row + 1) * stride <= cursor.plan.old.len);
            const bytes = cursor.plan.old[row * stride ..][0..stride];
            cursor.entry = Entry.init(row * stride, stride, stride, .raw, bytes);
            return std.mem.asBytes(&cursor.entry);
        }
    };

    pub fn begin(plan: *const ConvertPlan) Cursor {
        return .{ .plan = plan };
    }
};

/// Buffered sequential writer of a new store file that computes the block
/// checksums of a fixed data file as it goes.
pub const RowWriter = struct {
    const buffer_bytes = 256 * block_bytes; // 4 MiB

    file: io.File,
    sums_file: ?io.File,
    buffer: []u8,
    fill: u64 = 0,
    /// File offset of the first byte not yet written (excludes the buffer).
    flushed: u64 = 0,
    /// File offset of the next byte written by `write`.
    position: u64 = 0,
    sums: [256]u64 = undefined,

    pub const Written = struct { bytes: u64, tail_checksum: u64 };

    pub fn init(file: io.File, sums_file: ?io.File) Error!RowWriter {
        // Every flush but the last covers whole blocks, and one flush's
        // sums fit `sums`.
        comptime assert(buffer_bytes % block_bytes == 0);
        comptime assert(buffer_bytes / block_bytes <= 256);
        const buffer = allocator.alloc(u8, buffer_bytes) catch return error.OutOfMemory;
        return .{ .file = file, .sums_file = sums_file, .buffer = buffer };
    }

    pub fn deinit(writer: *RowWriter) void {
        assert(writer.buffer.len == buffer_bytes);
        allocator.free(writer.buffer);
    }

    pub fn write(writer: *RowWriter, bytes: []const u8) Error!void {
        var rest = bytes;
        while (rest.len > 0) {
            const room = writer.buffer.len - writer.fill;
            const take = @min(room, rest.len);
            @memcpy(writer.buffer[writer.fill..][0..take], rest[0..take]);
            writer.fill += take;
            writer.position += take;
            rest = rest[take..];
            if (writer.fill == writer.buffer.len) try writer.flush();
        }
        writer.invariant();
    }

    /// Bytes written are the bytes flushed and the bytes buffered.
    fn invariant(writer: *const RowWriter) void {
        assert(writer.fill <= writer.buffer.len);
        assert(writer.flushed + writer.fill == writer.position);
    }

    /// Writes the buffer; called only when it is full or at the end, so
    /// every flush but the last covers whole blocks.
    fn flush(writer: *RowWriter) Error!void {
        writer.invariant();
        assert(writer.flushed % block_bytes == 0);
        if (writer.sums_file) |sums_file| {
            const first_block = writer.flushed / block_bytes;
            const full = writer.fill / block_bytes;
            for (0..full) |k| {
                writer.sums[k] = format.blockChecksum(
                    first_block + k,
                    writer.buffer[k * block_bytes ..][0..block_bytes],
                );
            }
            try io.write(sums_file, std.mem.sliceAsBytes(writer.sums[0..full]), first_block * 8);
        }
        try io.write(writer.file, writer.buffer[0..writer.fill], writer.flushed);
        io.startWriteback(writer.file, writer.flushed, writer.fill);
        writer.flushed += writer.fill;
        writer.fill = 0;
    }

    pub fn finish(writer: *RowWriter) Error!Written {
        var tail_checksum: u64 = 0;
        const tail = writer.fill % block_bytes;
        if (tail != 0 and writer.sums_file != null) {
            const block = (writer.flushed + writer.fill) / block_bytes;
            tail_checksum = format.blockChecksum(
                block,
                writer.buffer[writer.fill - tail .. writer.fill],
            );
        }
        try writer.flush();
        writer.invariant();
        assert(writer.fill == 0);
        assert(writer.flushed == writer.position);
        return .{ .bytes = writer.position, .tail_checksum = tail_checksum };
    }
};

// ---- tests -----------------------------------------------------------------------

const testing = std.testing;

/// Drains a plan the way streamRows does and returns the rows it handed out.
fn drain(plan: anytype, row_count: u64, stride: u64, out: []u8) !void {
    assert(out.len == row_count * stride);
    var cursor = plan.begin();
    var row: u64 = 0;
    var at: usize = 0;
    while (row < row_count) {
        const bytes = cursor.next(row, row_count - row);
        try testing.expect(bytes.len >= stride and bytes.len % stride == 0);
        @memcpy(out[at..][0..bytes.len], bytes);
        at += bytes.len;
        row += bytes.len / stride;
    }
    try testing.expectEqual(out.len, at);
}

test "a patch plan hands out the new rows where patched and runs of old rows between" {
    const old = "aabbccddee";
    const patches = [_]Patch{ .{ .row = 1, .bytes = "XX" }, .{ .row = 4, .bytes = "YY" } };
    const plan = PatchPlan{ .old = old, .stride = 2, .patches = &patches };
    var out: [10]u8 = undefined;
    try drain(&plan, 5, 2, &out);
    try testing.expectEqualStrings("aaXXccddYY", &out);
}

test "a delete plan keeps order or fills holes from the tail, skipping doomed tail rows" {
    // Rows 0..7; delete 1, 3 and 6. Kept in order: 0 2 4 5 7. Tail fill:
    // holes 1 and 3 below the new end (5) take survivors 5 and 7 (6 is doomed).
    const old = "01234567";
    const doomed = [_]u64{ 1, 3, 6 };
    for ([_]bool{ true, false }, [_][]const u8{ "02457", "05274" }) |keep_order, expected| {
        const plan = DeletePlan{
            .old = old,
            .stride = 1,
            .doomed = &doomed,
            .remaining = 5,
            .keep_order = keep_order,
        };
        var out: [5]u8 = undefined;
        try drain(&plan, 5, 1, &out);
        try testing.expectEqualStrings(expected, &out);
    }
}

test "the row writer checksums every full block and the partial tail, across flushes" {
    const storage = @import("testing/storage.zig");
    storage.reset();
    const dir = try io.openDir(".");
    defer io.closeDir(dir);
    const file = try io.createFile(dir, "rows", true);
    defer io.closeFile(file);
    const sums = try io.createFile(dir, "sums", true);
    defer io.closeFile(sums);
    // Two and a half buffers of rows whose bytes depend on their position.
    const total = RowWriter.buffer_bytes * 2 + block_bytes / 2 + 3;
    var writer = try RowWriter.init(file, sums);
    defer writer.deinit();
    var chunk: [1000]u8 = undefined;
    var written: u64 = 0;
    while (written < total) {
        const take = @min(chunk.len, total - written);
        for (chunk[0..take], 0..) |*byte, k| byte.* = @truncate((written + k) *% 31);
        try writer.write(chunk[0..take]);
        written += take;
    }
    const result = try writer.finish();
    try testing.expectEqual(@as(u64, total), result.bytes);
    try testing.expectEqual(@as(u64, total), try io.length(file));
    const content = try testing.allocator.alloc(u8, total);
    defer testing.allocator.free(content);
    try testing.expectEqual(@as(usize, total), try io.read(file, content, 0));
    for (content, 0..) |byte, k| try testing.expectEqual(@as(u8, @truncate(k *% 31)), byte);
    const full_blocks = total / block_bytes;
    for (0..full_blocks) |block| {
        var sum: u64 = undefined;
        _ = try io.read(sums, std.mem.asBytes(&sum), block * 8);
        try testing.expectEqual(
            format.blockChecksum(block, content[block * block_bytes ..][0..block_bytes]),
            sum,
        );
    }
    try testing.expectEqual(
        format.blockChecksum(full_blocks, content[full_blocks * block_bytes ..]),
        result.tail_checksum,
    );
}
