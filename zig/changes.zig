//! The rows of a copy that differ from the original, looked for only in the
//! pages known to have been written: what `writable_batch_mode` commits.
//! The pages come from the kernel (the pagemap of a private mapping tells
//! which pages hold a private copy), so a batch that wrote k pages costs
//! O(k pages) of compares however large the array is.
const std = @import("std");
const status = @import("status.zig");
const assert = std.debug.assert;

/// `changedRows` of arguments from outside (the C ABI), checked first:
/// InvalidArgument for rows or pages of 0 bytes, buffers of other sizes or
/// not whole rows, page numbers that do not ascend, or too small an `out`.
pub fn checkedChangedRows(
    edited: []const u8,
    original: []const u8,
    row_bytes: u64,
    pages: []const u64,
    page_bytes: u64,
    out: []u64,
) status.Error!usize {
    if (row_bytes == 0 or page_bytes == 0 or edited.len != original.len or
        edited.len % row_bytes != 0)
    {
        return status.fail(
            error.InvalidArgument,
            "{d} and {d} bytes of rows of {d} bytes in pages of {d} bytes: both must be the " ++
                "same whole rows, rows and pages of at least a byte",
            .{ edited.len, original.len, row_bytes, page_bytes },
        );
    }
    if (pages.len > 1) for (pages[0 .. pages.len - 1], pages[1..]) |a, b| {
        if (b <= a) return status.fail(
            error.InvalidArgument,
            "page numbers must ascend: {d} follows {d}",
            .{ b, a },
        );
    };
    const needed = rowsCapacity(edited.len / row_bytes, row_bytes, pages.len, page_bytes);
    if (out.len < needed) return status.fail(
        error.InvalidArgument,
        "room for {d} rows, the {d} pages need {d}",
        .{ out.len, pages.len, needed },
    );
    return changedRows(edited, original, row_bytes, pages, page_bytes, out);
}

/// Writes into `out` the rows (ascending, each once) of `edited` whose bytes
/// differ from `original`'s, looking only at the rows that overlap `pages`
/// (ascending page numbers, pages of `page_bytes` from the start); returns
/// how many. Both buffers hold whole rows of `row_bytes`. A row is compared
/// whole, so a row that reaches into a page not given is still exact, and a
/// row across several given pages is compared once. `out` needs room for
/// every row the pages overlap (`rowsCapacity`).
pub fn changedRows(
    edited: []const u8,
    original: []const u8,
    row_bytes: u64,
    pages: []const u64,
    page_bytes: u64,
    out: []u64,
) usize {
    assert(row_bytes > 0 and page_bytes > 0);
    assert(edited.len == original.len and edited.len % row_bytes == 0);
    const rows = edited.len / row_bytes;
    var found: usize = 0;
    var next_row: u64 = 0; // rows before it are compared already
    var previous_page: ?u64 = null;
    for (pages) |page| {
        assert(previous_page == null or page > previous_page.?);
        previous_page = page;
        const start = page * page_bytes;
        if (start >= edited.len) break;
        const end = @min(start + page_bytes, edited.len);
        const last_row = (end - 1) / row_bytes;
        // From a row's start to the first byte that differs: that row is
        // changed, and the scan goes on at the next row's start.
        var at = @max(start / row_bytes, next_row) * row_bytes;
        const stop = (last_row + 1) * row_bytes;
        while (at < stop) {
            const differs = firstDifference(edited, original, at, stop);
            if (differs == stop) break;
            const row = differs / row_bytes;
            out[found] = row;
            found += 1;
            at = (row + 1) * row_bytes;
        }
        next_row = @max(next_row, last_row + 1);
    }
    assert(found <= rows and found <= out.len);
    return found;
}

const lanes = 32;
const Lane = @Vector(lanes, u8);

/// The first offset in `at..stop` where `a` and `b` differ, else `stop`:
/// 32 bytes a compare, the first differing lane by its bit.
fn firstDifference(a: []const u8, b: []const u8, at: u64, stop: u64) u64 {
    assert(at <= stop and stop <= a.len and a.len == b.len);
    var offset = at;
    while (offset + lanes <= stop) : (offset += lanes) {
        const x: Lane = a[offset..][0..lanes].*;
        const y: Lane = b[offset..][0..lanes].*;
        const mask: u32 = @bitCast(x != y);
        if (mask != 0) return offset + @ctz(mask);
    }
    while (offset < stop and a[offset] == b[offset]) offset += 1;
    return offset;
}

/// The room `changedRows` needs in `out` for `page_count` pages.
pub fn rowsCapacity(rows: u64, row_bytes: u64, page_count: u64, page_bytes: u64) u64 {
    assert(row_bytes > 0);
    return @min(rows, page_count *| (page_bytes / row_bytes + 2));
}

test "changedRows finds exactly the rows that differ within the pages given" {
    const testing = std.testing;
    var prng = std.Random.DefaultPrng.init(7);
    const random = prng.random();
    const page_bytes = 64;
    for ([_]u64{ 1, 3, 8, 24, 64, 100, 200 }) |row_bytes| {
        const rows = 5000 / row_bytes + 1;
        const original = try testing.allocator.alloc(u8, rows * row_bytes);
        defer testing.allocator.free(original);
        const edited = try testing.allocator.alloc(u8, original.len);
        defer testing.allocator.free(edited);
        random.bytes(original);
        @memcpy(edited, original);
        const page_count = std.math.divCeil(u64, original.len, page_bytes) catch unreachable;
        var written = try testing.allocator.alloc(bool, page_count);
        defer testing.allocator.free(written);
        @memset(written, false);
        for (0..40) |_| { // a changed byte makes its page written
            const at = random.uintLessThan(u64, original.len);
            edited[at] +%= 1 + random.uintLessThan(u8, 255);
            written[at / page_bytes] = true;
        }
        for (0..5) |_| { // pages written back with the same bytes
            written[random.uintLessThan(u64, page_count)] = true;
        }
        var pages: std.ArrayList(u64) = .empty;
        defer pages.deinit(testing.allocator);
        for (written, 0..) |yes, page| {
            if (yes) try pages.append(testing.allocator, page);
        }
        const out = try testing.allocator.alloc(
            u64,
            rowsCapacity(rows, row_bytes, pages.items.len, page_bytes),
        );
        defer testing.allocator.free(out);
        const found = changedRows(edited, original, row_bytes, pages.items, page_bytes, out);
        var expected: std.ArrayList(u64) = .empty;
        defer expected.deinit(testing.allocator);
        for (0..rows) |row| {
            const at = row * row_bytes;
            const a = edited[at..][0..row_bytes];
            if (!std.mem.eql(u8, a, original[at..][0..row_bytes])) {
                try expected.append(testing.allocator, row);
            }
        }
        try testing.expectEqualSlices(u64, expected.items, out[0..found]);
        // No page given: nothing found, even though rows differ.
        try testing.expectEqual(0, changedRows(edited, original, row_bytes, &.{}, page_bytes, out));
    }
}
