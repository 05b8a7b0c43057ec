//! The read path: batch gathers decoded straight into the caller's buffer
//! on the worker threads, and record lengths.
//!
//! Invariant: a gather reads only what its snapshot committed, and validates
//! every index, entry and destination range before any thread touches the
//! target, so a bad batch fails whole and a damaged entry is never used as
//! an offset or a length.
const std = @import("std");
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const workers = @import("workers.zig");
const integrity = @import("integrity.zig");
const io = @import("io.zig");
const Snapshot = @import("snapshot.zig").Snapshot;

const assert = std.debug.assert;
const Error = status.Error;

pub fn checkIndices(snapshot: *const Snapshot, indices: []const u64) Error!void {
    const limit = snapshot.count();
    // One pass the compiler vectorises; the offender is looked for only then.
    var largest: u64 = 0;
    for (indices) |index| largest = @max(largest, index);
    if (indices.len == 0 or largest < limit) return;
    for (indices) |index| {
        if (index >= limit) {
            return status.fail(
                error.IndexOutOfRange,
                "index {d} is out of range for a store of {d} records",
                .{ index, limit },
            );
        }
    }
}

pub fn lengths(
    snapshot: *const Snapshot,
    verify_reads: bool,
    indices: []const u64,
    out: []u64,
) Error!void {
    assert(indices.len == out.len);
    try checkIndices(snapshot, indices);
    for (indices, out) |index, *length| {
        length.* = try snapshot.recordLength(index);
        if (verify_reads and !integrity.recordSound(snapshot, index)) {
            return status.fail(
                error.ChecksumMismatch,
                "record {d}: checksum mismatch (the record or its index entry is damaged)",
                .{index},
            );
        }
    }
}

/// Decodes records `indices` into `target`: record k at byte
/// `target_offsets[k]` or, without offsets, at `k * length` when all the
/// records share one length.
pub fn gather(
    snapshot: *const Snapshot,
    threads: u32,
    verify_reads: bool,
    indices: []const u64,
    target: []u8,
    target_offsets: ?[]const u64,
) Error!void {
    try checkIndices(snapshot, indices);
    // Without offsets every record must have the first one's length.
    const target_stride = if (indices.len == 0) 0 else try snapshot.recordLength(indices[0]);
    const total_bytes = if (snapshot.layout() == .fixed and target_offsets == null)
        try fixedBytes(snapshot, indices, target)
    else
        try checkedBytes(snapshot, indices, target, target_offsets, target_stride);
    var job = GatherJob{
        .snapshot = snapshot,
        .indices = indices,
        .target = target,
        .target_offsets = target_offsets,
        .target_stride = target_stride,
        .verify_reads = verify_reads,
    };
    workers.parallelFor(indices.len, total_bytes, threads, &job, GatherJob.run);
    try job.failure.check("cannot read");
}

/// Equal records back to back: one size check, not one per record (which
/// cost more than the copy itself on a million 40-byte rows).
fn fixedBytes(snapshot: *const Snapshot, indices: []const u64, target: []const u8) Error!u64 {
    const stride = snapshot.superblock.record_bytes;
    const total = std.math.mul(u64, indices.len, stride) catch std.math.maxInt(u64);
    if (total > target.len) {
        return status.fail(
            error.BufferTooSmall,
            "a batch of {d} records of {d} bytes does not fit the destination: it has {d} " ++
                "bytes, the batch needs {d}",
            .{ indices.len, stride, target.len, total },
        );
    }
    return total;
}

/// The bytes of records `indices`, each checked to fit the destination at
/// its offset.
fn checkedBytes(
    snapshot: *const Snapshot,
    indices: []const u64,
    target: []const u8,
    target_offsets: ?[]const u64,
    target_stride: u64,
) Error!u64 {
    var total_bytes: u64 = 0;
    for (indices, 0..) |index, k| {
        const length = try snapshot.recordLength(index);
        if (target_offsets == null and length != target_stride) {
            return status.fail(
                error.InvalidArgument,
                "record {d} has {d} bytes but record {d} has {d}: records of different lengths " ++
                    "need explicit destination offsets",
                .{ index, length, indices[0], target_stride },
            );
        }
        const start = if (target_offsets) |offsets|
            offsets[k]
        else
            std.math.mul(u64, k, target_stride) catch std.math.maxInt(u64);
        const end = std.math.add(u64, start, length) catch std.math.maxInt(u64);
        if (end > target.len) {
            return status.fail(
                error.BufferTooSmall,
                "record {d} ({d} bytes) does not fit the destination at offset {d}: the " ++
                    "destination has {d} bytes",
                .{ index, length, start, target.len },
            );
        }
        total_bytes += length;
    }
    return total_bytes;
}

/// Below this a readahead hint costs more than the page faults it saves.
const prefetch_bytes_min = 64 * 1024;

/// Asks the kernel to read `bytes` of a mapping ahead, in one request, when
/// they are many: the data mapping is MADV_RANDOM, so nothing else would.
/// (Long runs of fixed records are copied by `copyRun` instead.)
fn prefetch(bytes: []const u8) void {
    if (bytes.len < prefetch_bytes_min) return;
    io.advise(bytes, .will_need);
}

const GatherJob = struct {
    snapshot: *const Snapshot,
    indices: []const u64,
    target: []u8,
    target_offsets: ?[]const u64,
    target_stride: u64,
    verify_reads: bool,
    failure: workers.Failure = .{},

    /// Fixed layout: copies runs of consecutive records that land back to
    /// back in the target with one copy each. Long runs (a slice, a full
    /// load) are read with pread: one copy from the page cache with the
    /// file's sequential readahead, no page faults on the mapping.
    fn runFixed(job: *GatherJob, start: u64, end: u64) void {
        const snapshot = job.snapshot;
        const stride = snapshot.superblock.record_bytes;
        var k = start;
        while (k < end) {
            const first = job.indices[k];
            const at = job.targetAt(k);
            var count: u64 = 1;
            while (k + count < end and job.indices[k + count] == first + count and
                job.targetAt(k + count) == at + count * stride) count += 1;
            const bytes = count * stride;
            if (job.verify_reads and !integrity.fixedRangeSound(snapshot, first * stride, bytes)) {
                for (first..first + count) |index| {
                    if (!integrity.fixedRangeSound(snapshot, index * stride, stride)) {
                        return job.failure.set(
                            error.ChecksumMismatch,
                            index,
                            "checksum mismatch (the data file is damaged)",
                        );
                    }
                }
            }
            const target = job.target[at..][0..bytes];
            if (bytes >= prefetch_bytes_min) {
                copyRun(snapshot, first * stride, target) catch |err| switch (err) {
                    error.Io => return job.failure.set(
                        error.Io,
                        first,
                        "cannot read the data file",
                    ),
                    error.Corrupt => return job.failure.set(
                        error.Corrupt,
                        first,
                        "the data file is shorter than committed",
                    ),
                };
            } else {
                @memcpy(target, snapshot.dataBytes()[first * stride ..][0..bytes]);
            }
            k += count;
        }
    }

    /// A long run, 8 MiB at a time: one copy from the mapping when the
    /// page cache holds the piece (its pages mapped by one call), else a
    /// pread, whose readahead reads a cold file in large requests. Faulting
    /// a cold MADV_RANDOM mapping in reads 4 KiB at a time (0.8 s against
    /// 32 ms for 40 MB here), and a warm pread copies in the kernel at a
    /// third of a copy's speed (14.4 against 3.9 ms for 40 MB).
    fn copyRun(snapshot: *const Snapshot, offset: u64, target: []u8) error{ Io, Corrupt }!void {
        const piece_bytes = io.populate_pages_max * io.page_size;
        var done: u64 = 0;
        while (done < target.len) {
            const piece = target[done..][0..@min(piece_bytes, target.len - done)];
            const source = snapshot.dataBytes()[offset + done ..][0..piece.len];
            if (io.populateIfCached(source)) {
                @memcpy(piece, source);
            } else {
                const read = io.read(
                    snapshot.data.?.file,
                    piece,
                    offset + done,
                ) catch return error.Io;
                if (read != piece.len) return error.Corrupt;
            }
            done += piece.len;
        }
    }

    fn targetAt(job: *const GatherJob, k: u64) u64 {
        return if (job.target_offsets) |offsets| offsets[k] else k * job.target_stride;
    }

    fn run(job: *GatherJob, start: u64, end: u64) void {
        if (job.snapshot.layout() == .fixed) return job.runFixed(start, end);
        var decoder: ?*codec.Decoder = null;
        defer if (decoder) |d| codec.giveDecoder(d);
        var shuffled: codec.Scratch = .{};
        defer shuffled.deinit();
        const snapshot = job.snapshot;
        for (start..end) |k| {
            const index = job.indices[k];
            const at = job.targetAt(k);
            const entry = snapshot.entries()[index];
            // Lengths were validated by the caller; the snapshot is immutable.
            const payload = snapshot.dataBytes()[entry.offset..][0..entry.storedBytes()];
            prefetch(payload);
            if (job.verify_reads and entry.payloadChecksum(payload) != entry.checksum) {
                return job.failure.set(
                    error.ChecksumMismatch,
                    index,
                    "checksum mismatch (the record is damaged)",
                );
            }
            const record_codec = entry.codec().?;
            if (record_codec != .raw and decoder == null) {
                decoder = codec.takeDecoder() catch return job.failure.set(
                    error.OutOfMemory,
                    index,
                    "out of memory for a decompression context",
                );
            }
            codec.decode(
                decoder,
                record_codec,
                snapshot.dictionary,
                payload,
                job.target[at..][0..entry.raw_bytes],
                &shuffled,
            ) catch |err| switch (err) {
                error.OutOfMemory => return job.failure.set(
                    error.OutOfMemory,
                    index,
                    "out of memory for the shuffled copy of the record",
                ),
                error.Corrupt => return job.failure.set(
                    error.Corrupt,
                    index,
                    "the stored frame does not decode to the record's length (the store is " ++
                        "damaged)",
                ),
                error.NoDictionary => return job.failure.set(
                    error.Corrupt,
                    index,
                    "record needs the store's dictionary, which is missing",
                ),
            };
        }
    }
};
