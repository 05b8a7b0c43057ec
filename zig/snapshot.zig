//! Snapshots: what a reader sees. A snapshot is a validated superblock plus
//! read-only mappings of the files it names; a gather loads the current one
//! and reads only bytes its superblock committed.
//!
//! Invariant: committed bytes never change under a live mapping, except
//! inside the sequence lock (seqlock.zig): an in-place replace
//! makes the lock odd, writes, and makes it even, and a gather that saw the
//! lock change retries (Store.gather), so each gather reads one committed
//! state whole. Otherwise writers append past committed lengths or write new
//! files; a snapshot a writer replaced, and the mappings only it used, are
//! kept until no gather is in flight (`Snapshots.retire` / `reclaim`), so a
//! gather racing an append, a delete or a compaction reads a consistent,
//! still-mapped state.
const std = @import("std");
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const io = @import("io.zig");
const seqlock = @import("seqlock.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Superblock = format.Superblock;
const Entry = format.Entry;
const Layout = format.Layout;
const block_bytes = format.block_bytes;

/// A read-only mapping of one store file. The mapping reserves more address
/// space than the file holds, so appends need no remap; bytes past the
/// committed length are never touched.
pub const Mapping = struct {
    file: io.File,
    memory: io.Memory,
    id: u64,

    /// Maps file `id` of `kind`, which must hold at least `needed` bytes, or
    /// returns `reuse` when it is the same file and already maps enough.
    pub fn open(
        dir: io.Dir,
        kind: format.FileKind,
        id: u64,
        needed: u64,
        reuse: ?*Mapping,
    ) Error!*Mapping {
        if (reuse) |mapping| {
            if (mapping.id == id and mapping.memory.len >= needed) return mapping;
        }
        assert(id > 0); // A superblock that decodes names no file 0.
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const file = try io.openFile(dir, format.fileName(&name_buffer, kind, id), .read_only);
        errdefer io.closeFile(file);
        const size = try io.length(file);
        if (size < needed) {
            return status.fail(
                error.Corrupt,
                "store '{s}' is damaged: '{s}' holds {d} bytes but the superblock needs {d}",
                .{ dir.path, file.name(), size, needed },
            );
        }
        const reserve_min: u64 = 64 << 20;
        const grown = std.math.add(u64, needed, needed / 2) catch needed;
        const memory = try io.map(file, needed, @max(reserve_min, grown));
        errdefer io.unmap(memory);
        // Loaders read records at random: readahead around each fault would
        // pull in megabytes per record from a cold disk. Long runs are read
        // with pread (fixed layout) or get an explicit WILLNEED (`prefetch`).
        if (kind == .data) io.advise(memory, .random);
        // The committed length is mapped: readers slice up to it unchecked.
        assert(memory.len >= needed);
        const mapping = allocator.create(Mapping) catch return error.OutOfMemory;
        mapping.* = .{ .file = file, .memory = memory, .id = id };
        return mapping;
    }

    /// Maps the shared page of the lock file (seqlock.zig), or null while
    /// the lock file holds none: then no writer has replaced in place since
    /// the store was made or the machine restarted, and the next one writes
    /// it before it does (under the writer lock, which readers check first).
    pub fn openSharedPage(dir: io.Dir) Error!?*Mapping {
        const file = io.openFile(dir, seqlock.lock_file_name, .read_only) catch |err| switch (err) {
            error.NotFound => return null,
            else => return err,
        };
        errdefer io.closeFile(file);
        if (try io.length(file) < seqlock.shared_page_bytes) {
            io.closeFile(file);
            return null;
        }
        const memory = try io.map(file, seqlock.shared_page_bytes, seqlock.shared_page_bytes);
        errdefer io.unmap(memory);
        assert(memory.len >= seqlock.shared_page_bytes);
        const mapping = allocator.create(Mapping) catch return error.OutOfMemory;
        mapping.* = .{ .file = file, .memory = memory, .id = 0 };
        return mapping;
    }

    pub fn destroy(mapping: *Mapping) void {
        io.unmap(mapping.memory);
        io.closeFile(mapping.file);
        allocator.destroy(mapping);
    }
};

pub const Snapshot = struct {
    superblock: Superblock,
    data: ?*Mapping = null,
    index: ?*Mapping = null,
    sums: ?*Mapping = null,
    /// The shared page in the lock file (fixed stores; every writer writes
    /// it before its first commit).
    journal: ?*Mapping = null,
    dictionary: ?*const codec.Dictionary = null,

    pub fn count(snapshot: *const Snapshot) u64 {
        assert(snapshot.superblock.record_count <= format.record_count_max);
        return snapshot.superblock.record_count;
    }

    pub fn layout(snapshot: *const Snapshot) Layout {
        return snapshot.superblock.getLayout();
    }

    pub fn dataBytes(snapshot: *const Snapshot) []const u8 {
        const mapping = snapshot.data orelse return &.{};
        assert(snapshot.superblock.data_bytes <= mapping.memory.len);
        return mapping.memory[0..snapshot.superblock.data_bytes];
    }

    pub fn entries(snapshot: *const Snapshot) []const Entry {
        const mapping = snapshot.index orelse return &.{};
        assert(snapshot.layout() == .indexed);
        const bytes = mapping.memory[0 .. snapshot.count() * @sizeOf(Entry)];
        return @alignCast(std.mem.bytesAsSlice(Entry, bytes));
    }

    pub fn blockSums(snapshot: *const Snapshot) []const u64 {
        const mapping = snapshot.sums orelse return &.{};
        assert(snapshot.layout() == .fixed);
        const bytes = mapping.memory[0 .. (snapshot.superblock.data_bytes / block_bytes) * 8];
        return @alignCast(std.mem.bytesAsSlice(u64, bytes));
    }

    pub fn mappings(snapshot: *const Snapshot) [4]?*Mapping {
        assert(snapshot.data == null or snapshot.data != snapshot.index);
        return .{ snapshot.data, snapshot.index, snapshot.sums, snapshot.journal };
    }

    pub fn journalPage(snapshot: *const Snapshot) ?*const format.JournalPage {
        const mapping = snapshot.journal orelse return null;
        assert(mapping.memory.len >= @sizeOf(format.JournalPage));
        return @ptrCast(mapping.memory.ptr);
    }

    /// The partial last block's checksum: in-place replaces keep it in the
    /// journal's shared page, under the sequence lock.
    pub fn tailChecksum(snapshot: *const Snapshot) u64 {
        return seqlock.tailChecksum(snapshot.journalPage(), &snapshot.superblock);
    }

    /// Raw length of record `index`; Corrupt if its entry is not sound.
    pub fn recordLength(snapshot: *const Snapshot, index: u64) Error!u64 {
        assert(index < snapshot.count());
        if (snapshot.layout() == .fixed) return snapshot.superblock.record_bytes;
        const entry = snapshot.entries()[index];
        if (entry.invalidReason(snapshot.superblock.data_bytes)) |reason| {
            return status.fail(error.Corrupt, "record {d}: {s}", .{ index, reason });
        }
        return entry.raw_bytes;
    }

    /// Maps the files `superblock` names, sharing `previous`'s mappings where
    /// they still cover enough.
    pub fn build(
        dir: io.Dir,
        superblock: Superblock,
        previous: ?*const Snapshot,
        dictionary: ?*const codec.Dictionary,
    ) Error!*Snapshot {
        assert(superblock.invalidReason() == null);
        const snapshot = allocator.create(Snapshot) catch return error.OutOfMemory;
        snapshot.* = .{ .superblock = superblock, .dictionary = dictionary };
        errdefer snapshot.discard(previous);
        const old: [4]?*Mapping = if (previous) |p| p.mappings() else .{ null, null, null, null };
        if (superblock.getLayout() == .fixed)
            snapshot.journal = old[3] orelse try Mapping.openSharedPage(dir);
        switch (superblock.getLayout()) {
            .empty => {},
            .fixed => {
                snapshot.data = try Mapping.open(
                    dir,
                    .data,
                    superblock.data_file,
                    superblock.data_bytes,
                    old[0],
                );
                const sums_bytes = (superblock.data_bytes / block_bytes) * 8;
                snapshot.sums = try Mapping.open(
                    dir,
                    .sums,
                    superblock.sums_file,
                    sums_bytes,
                    old[2],
                );
            },
            .indexed => {
                snapshot.data = try Mapping.open(
                    dir,
                    .data,
                    superblock.data_file,
                    superblock.data_bytes,
                    old[0],
                );
                const index_bytes = superblock.record_count * @sizeOf(Entry);
                snapshot.index = try Mapping.open(
                    dir,
                    .index,
                    superblock.index_file,
                    index_bytes,
                    old[1],
                );
            },
        }
        // Each layout maps what its readers slice: data unless empty, an
        // index when indexed, block sums and the shared page when fixed.
        assert((snapshot.data != null) == (superblock.getLayout() != .empty));
        assert((snapshot.index != null) == (superblock.getLayout() == .indexed));
        assert((snapshot.sums != null) == (superblock.getLayout() == .fixed));
        return snapshot;
    }

    /// Frees a snapshot that was never published, and the mappings it does
    /// not share with `previous`.
    pub fn discard(snapshot: *Snapshot, previous: ?*const Snapshot) void {
        assert(previous == null or previous.? != snapshot);
        const old: [4]?*Mapping = if (previous) |p| p.mappings() else .{ null, null, null, null };
        for (snapshot.mappings(), old) |mapping, shared| {
            if (mapping) |m| if (m != shared) m.destroy();
        }
        allocator.destroy(snapshot);
    }
};

/// The current snapshot of a store, and the old ones readers may still use.
pub const Snapshots = struct {
    current: std.atomic.Value(*Snapshot),
    in_flight: std.atomic.Value(u64) = .init(0),
    /// Guards the retired lists; taken by writers, refreshes and the last
    /// reader out.
    mutex: std.Thread.Mutex = .{},
    retired_snapshots: std.ArrayList(*Snapshot) = .empty,
    retired_mappings: std.ArrayList(*Mapping) = .empty,
    has_retired: std.atomic.Value(bool) = .init(false),

    pub fn init(first: *Snapshot) Snapshots {
        assert(first.superblock.record_count <= format.record_count_max);
        return .{ .current = .init(first) };
    }

    pub fn deinit(snapshots: *Snapshots) void {
        assert(snapshots.in_flight.load(.seq_cst) == 0);
        snapshots.retire(snapshots.head(), null);
        snapshots.reclaim();
        snapshots.retired_snapshots.deinit(allocator);
        snapshots.retired_mappings.deinit(allocator);
    }

    /// The current snapshot, for the writer (who alone replaces it).
    pub fn head(snapshots: *Snapshots) *Snapshot {
        return snapshots.current.load(.seq_cst);
    }

    /// Makes `next` current. Caller holds `mutex`.
    pub fn publish(snapshots: *Snapshots, next: *Snapshot) void {
        const previous = snapshots.current.swap(next, .seq_cst);
        assert(previous != next);
        snapshots.retire(previous, next);
        snapshots.reclaim();
    }

    fn retire(snapshots: *Snapshots, old: *Snapshot, next: ?*const Snapshot) void {
        assert(next == null or next.? != old);
        const kept: [4]?*Mapping = if (next) |n| n.mappings() else .{ null, null, null, null };
        for (old.mappings()) |mapping| {
            const m = mapping orelse continue;
            if (std.mem.indexOfScalar(?*Mapping, &kept, m) != null) continue;
            snapshots.retired_mappings.append(allocator, m) catch {
                // Without room to defer the unmap we must keep it mapped: leak
                // it rather than unmap under a reader.
            };
        }
        snapshots.retired_snapshots.append(allocator, old) catch {};
        snapshots.has_retired.store(true, .seq_cst);
    }

    /// Frees retired snapshots and mappings when no gather can still see them.
    /// A gather counts itself in before it loads the snapshot pointer, so one
    /// that started after the swap sees the new snapshot.
    fn reclaim(snapshots: *Snapshots) void {
        if (snapshots.in_flight.load(.seq_cst) != 0) return;
        snapshots.has_retired.store(false, .seq_cst);
        for (snapshots.retired_mappings.items) |mapping| mapping.destroy();
        snapshots.retired_mappings.clearRetainingCapacity();
        for (snapshots.retired_snapshots.items) |snapshot| allocator.destroy(snapshot);
        snapshots.retired_snapshots.clearRetainingCapacity();
        assert(snapshots.retired_mappings.items.len == 0);
    }

    pub fn acquire(snapshots: *Snapshots) *Snapshot {
        const before = snapshots.in_flight.fetchAdd(1, .seq_cst);
        assert(before < std.math.maxInt(u64));
        return snapshots.current.load(.seq_cst);
    }

    /// The last reader out frees what writers retired meanwhile, so a store
    /// that is read without pause while it is written does not pile up old
    /// snapshots until the next quiet commit.
    pub fn release(snapshots: *Snapshots) void {
        const before = snapshots.in_flight.fetchSub(1, .seq_cst);
        assert(before > 0);
        if (before == 1 and snapshots.has_retired.load(.seq_cst) and snapshots.mutex.tryLock()) {
            defer snapshots.mutex.unlock();
            snapshots.reclaim();
        }
    }
};
