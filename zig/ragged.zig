//! Ragged gathers in one call: a batch of variable-length records packed
//! back to back into the caller's buffer, with each record's offset counted
//! in rows of the dataset's item. Python used to ask for the lengths, build
//! the offsets and check them with NumPy, then gather: three crossings and a
//! dozen temporaries, which cost as much as the native copy.
//!
//! Invariant: nothing is read into the target unless every record is a
//! whole number of rows and the packed batch fits; `offsets` then says how
//! many bytes the batch needs, so the caller can grow its buffer and retry.
const std = @import("std");
const status = @import("status.zig");
const read = @import("read.zig");
const Store = @import("store.zig").Store;

const assert = std.debug.assert;
const Error = status.Error;

/// `offsets[k + 1]` holds record k's byte length on entry; on return
/// `offsets` are the packed byte offsets from 0. Returns the total bytes.
/// Refuses a record that is not a whole number of `row_bytes`-byte rows
/// (with `row_bytes` 0, every record must be empty).
pub fn packLengths(indices: []const u64, offsets: []u64, row_bytes: u64) Error!u64 {
    assert(offsets.len == indices.len + 1);
    offsets[0] = 0;
    for (indices, offsets[1..], 0..) |index, *end, k| {
        const length = end.*;
        const whole = if (row_bytes == 0) length == 0 else length % row_bytes == 0;
        if (!whole) {
            return status.fail(
                error.InvalidArgument,
                "record {d} is {d} bytes, not a whole number of {d}-byte rows: the store does " ++
                    "not match its schema",
                .{ index, length, row_bytes },
            );
        }
        end.* = offsets[k] + length;
    }
    return offsets[indices.len];
}

/// Turns packed byte offsets into row offsets, after the gather used them.
pub fn toRows(offsets: []u64, row_bytes: u64) void {
    if (row_bytes == 0) return @memset(offsets, 0);
    if (std.math.isPowerOfTwo(row_bytes)) {
        const shift: u6 = @intCast(std.math.log2_int(u64, row_bytes));
        for (offsets) |*offset| offset.* >>= shift;
    } else {
        for (offsets) |*offset| offset.* /= row_bytes;
    }
}

/// Gathers records `indices` of `store` packed from the start of `target`
/// and fills `offsets` (`indices.len + 1` entries) with their row offsets.
/// Returns the bytes the batch needs: if that is more than `target.len`,
/// nothing was read and `offsets` hold byte offsets.
pub fn gatherStore(
    store: *Store,
    indices: []const u64,
    row_bytes: u64,
    target: []u8,
    offsets: []u64,
) Error!u64 {
    status.clear();
    assert(offsets.len == indices.len + 1);
    // One snapshot for the lengths and the copy, so they cannot disagree.
    const snapshot = store.snapshots.acquire();
    defer store.snapshots.release();
    try read.checkIndices(snapshot, indices);
    // A batch's entries are scattered over the table: ask for all of them
    // before reading any, so their cache misses overlap instead of queueing.
    const entries = snapshot.entries();
    if (entries.len > 0) for (indices) |index| @prefetch(&entries[index], .{});
    for (indices, offsets[1..]) |index, *length| length.* = try snapshot.recordLength(index);
    const total = try packLengths(indices, offsets, row_bytes);
    if (total > target.len) return total;
    try read.gather(
        snapshot,
        store.threads,
        store.checksReads(snapshot),
        indices,
        target[0..total],
        offsets[0..indices.len],
    );
    toRows(offsets, row_bytes);
    return total;
}

test "packLengths packs whole rows and refuses a partial one" {
    var offsets = [_]u64{ 99, 8, 0, 12 };
    try std.testing.expectEqual(@as(u64, 20), try packLengths(&.{ 5, 6, 7 }, &offsets, 4));
    try std.testing.expectEqualSlices(u64, &.{ 0, 8, 8, 20 }, &offsets);
    toRows(&offsets, 4);
    try std.testing.expectEqualSlices(u64, &.{ 0, 2, 2, 5 }, &offsets);
    var odd = [_]u64{ 0, 12, 6 };
    try std.testing.expectEqual(@as(u64, 18), try packLengths(&.{ 1, 2 }, &odd, 6));
    toRows(&odd, 6);
    try std.testing.expectEqualSlices(u64, &.{ 0, 2, 3 }, &odd);
    var partial = [_]u64{ 0, 8, 6 };
    try std.testing.expectError(error.InvalidArgument, packLengths(&.{ 1, 2 }, &partial, 4));
    var empty_rows = [_]u64{ 0, 0, 1 };
    try std.testing.expectError(error.InvalidArgument, packLengths(&.{ 1, 2 }, &empty_rows, 0));
}
