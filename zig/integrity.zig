//! Integrity: whether stored bytes still match their checksums. Fixed
//! stores check 16 KiB blocks of the data file against the sums file (the
//! partial last block against the superblock); indexed stores check each
//! record's payload against its entry.
//!
//! Invariant: a record is sound only if every byte a read of it would
//! return is covered by a checksum that matches; an entry that is not
//! itself valid makes its record unsound rather than trusted.
const std = @import("std");
const format = @import("format.zig");
const Snapshot = @import("snapshot.zig").Snapshot;
const status = @import("status.zig");

const assert = std.debug.assert;
const block_bytes = format.block_bytes;

/// Whether block `block` of a fixed store's data matches its committed checksum.
pub fn blockSound(snapshot: *const Snapshot, block: u64) bool {
    const data = snapshot.dataBytes();
    const start = block * block_bytes;
    const end = @min(start + block_bytes, data.len);
    const expected = if (block < data.len / block_bytes)
        snapshot.blockSums()[block]
    else
        snapshot.tailChecksum();
    return format.blockChecksum(block, data[start..end]) == expected;
}

/// Whether every block overlapping data bytes [start, start + bytes) holds.
pub fn fixedRangeSound(snapshot: *const Snapshot, start: u64, bytes: u64) bool {
    if (bytes == 0) return true;
    const first = start / block_bytes;
    const last = (start + bytes - 1) / block_bytes;
    for (first..last + 1) |block| {
        if (!blockSound(snapshot, block)) return false;
    }
    return true;
}

/// Writes into `out` the records of [start, end) that are not sound
/// (ascending) and returns how many. A fixed store's blocks are each hashed
/// once, however many records share them: records of 40 bytes checked one
/// by one hashed their 16 KiB block 400 times over (300 ms for 40 MB).
pub fn unsoundRecords(snapshot: *const Snapshot, start: u64, end: u64, out: []u64) u64 {
    assert(start <= end and end <= snapshot.count() and out.len >= end - start);
    var found: u64 = 0;
    if (snapshot.layout() != .fixed) {
        for (start..end) |index| {
            if (!recordSound(snapshot, index)) {
                out[found] = index;
                found += 1;
            }
        }
        return found;
    }
    const stride = snapshot.superblock.record_bytes;
    if (stride == 0) return 0;
    var checked: ?u64 = null; // the last block hashed, and its verdict
    var checked_sound = true;
    for (start..end) |index| {
        const first = index * stride / block_bytes;
        const last = (index * stride + stride - 1) / block_bytes;
        var sound = true;
        for (first..last + 1) |block| {
            if (checked != block) {
                assert(checked == null or block > checked.?); // records ascend
                checked = block;
                checked_sound = blockSound(snapshot, block);
            }
            sound = sound and checked_sound;
        }
        if (!sound) {
            out[found] = index;
            found += 1;
        }
    }
    return found;
}

/// The refusal of a write (`what`) that would carry the damaged block
/// `block` (records `first` to `last`) into new checksums.
pub fn damagedBlock(block: u64, first: u64, last: u64, what: []const u8) status.Error {
    return status.fail(
        error.Corrupt,
        "block {d} of the data file (records {d} to {d}) does not match its checksum: it was " ++
            "damaged on disk. The {s} changed nothing; run verify() to list the damaged " ++
            "records, then replace each of them whole (same length, raw) or restore the " ++
            "store from a copy",
        .{ block, first, last, what },
    );
}

/// The first block of a fixed store that does not hold, or null.
pub fn firstUnsoundBlock(snapshot: *const Snapshot) ?u64 {
    const data = snapshot.dataBytes();
    const blocks = std.math.divCeil(usize, data.len, block_bytes) catch unreachable;
    for (0..blocks) |block| {
        if (!blockSound(snapshot, block)) return block;
    }
    return null;
}

pub fn recordSound(snapshot: *const Snapshot, index: u64) bool {
    if (snapshot.layout() == .fixed) {
        const stride = snapshot.superblock.record_bytes;
        return fixedRangeSound(snapshot, index * stride, stride);
    }
    const entry = snapshot.entries()[index];
    if (entry.invalidReason(snapshot.superblock.data_bytes) != null) return false;
    const payload = snapshot.dataBytes()[entry.offset..][0..entry.storedBytes()];
    return entry.payloadChecksum(payload) == entry.checksum;
}

/// Whether the bytes `snapshot` (an unsynced commit) holds beyond its synced
/// `base` are sound: the blocks or entries past the base's end when they
/// share files, everything in files the base does not name.
pub fn changedSound(snapshot: *const Snapshot, base: *const format.Superblock) bool {
    const superblock = &snapshot.superblock;
    const same_data = base.data_file == superblock.data_file and
        base.getLayout() == superblock.getLayout();
    switch (snapshot.layout()) {
        .empty => return true,
        .fixed => {
            const same = same_data and base.sums_file == superblock.sums_file;
            const start = if (same) base.data_bytes / block_bytes * block_bytes else 0;
            return fixedRangeSound(snapshot, start, superblock.data_bytes - start);
        },
        .indexed => {
            const same = same_data and base.index_file == superblock.index_file;
            const first = if (same) base.record_count else 0;
            for (first..snapshot.count()) |index| {
                if (!recordSound(snapshot, index)) return false;
            }
            return true;
        },
    }
}
