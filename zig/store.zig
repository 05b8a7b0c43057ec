//! zrecord: a persistent record store. format.zig describes the files; this
//! file opens them, reads batches across threads, and commits changes.
//!
//! Concurrency model. Readers never lock: a gather loads the current
//! `Snapshot` (a validated superblock plus read-only mappings of its files)
//! and reads only bytes the snapshot's superblock committed. A writer (one per
//! store, across processes, by flock on `lock`) builds the next snapshot,
//! writes the superblock, and publishes the snapshot with one atomic swap.
//! Replaced snapshots and mappings are kept until no gather is in flight, so a
//! gather racing an append or a delete reads a consistent, still-mapped state.
const std = @import("std");
const posix = std.posix;
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const zstd = @import("zstd.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const page_size = std.heap.page_size_min;
const Error = status.Error;
const Superblock = format.Superblock;
const Entry = format.Entry;
const Codec = format.Codec;
const Layout = format.Layout;
const block_bytes = format.block_bytes;

comptime {
    assert(@sizeOf(usize) == @sizeOf(u64));
}

/// A read-only mapping of one store file. The mapping reserves more address
/// space than the file holds, so appends need no remap; bytes past the
/// committed length are never touched.
const Mapping = struct {
    file: std.fs.File,
    memory: []align(page_size) const u8,
    id: u64,

    fn destroy(mapping: *Mapping) void {
        posix.munmap(mapping.memory);
        mapping.file.close();
        allocator.destroy(mapping);
    }
};

const Snapshot = struct {
    superblock: Superblock,
    data: ?*Mapping = null,
    index: ?*Mapping = null,
    sums: ?*Mapping = null,
    dictionary: ?*const codec.Dictionary = null,

    fn count(snapshot: *const Snapshot) u64 {
        return snapshot.superblock.record_count;
    }

    fn layout(snapshot: *const Snapshot) Layout {
        return snapshot.superblock.getLayout();
    }

    fn dataBytes(snapshot: *const Snapshot) []const u8 {
        const mapping = snapshot.data orelse return &.{};
        return mapping.memory[0..snapshot.superblock.data_bytes];
    }

    fn entries(snapshot: *const Snapshot) []const Entry {
        const mapping = snapshot.index orelse return &.{};
        const bytes = mapping.memory[0 .. snapshot.count() * @sizeOf(Entry)];
        return @alignCast(std.mem.bytesAsSlice(Entry, bytes));
    }

    fn blockSums(snapshot: *const Snapshot) []const u64 {
        const mapping = snapshot.sums orelse return &.{};
        const bytes = mapping.memory[0 .. (snapshot.superblock.data_bytes / block_bytes) * 8];
        return @alignCast(std.mem.bytesAsSlice(u64, bytes));
    }

    fn mappings(snapshot: *const Snapshot) [3]?*Mapping {
        return .{ snapshot.data, snapshot.index, snapshot.sums };
    }

    /// Raw length of record `index`; Corrupt if its entry is not sound.
    fn recordLength(snapshot: *const Snapshot, index: u64) Error!u64 {
        assert(index < snapshot.count());
        if (snapshot.layout() == .fixed) return snapshot.superblock.record_bytes;
        const entry = snapshot.entries()[index];
        if (entry.invalidReason(snapshot.superblock.data_bytes)) |reason| {
            return status.fail(error.Corrupt, "record {d}: {s}", .{ index, reason });
        }
        return entry.raw_bytes;
    }
};

pub const Info = extern struct {
    records: u64,
    live_bytes: u64,
    chunk_bytes: u64,
    reclaimable: u64,
    record_bytes: u64,
    generation: u64,
    layout: u32,
    has_dict: u32,
};

comptime {
    assert(@sizeOf(Info) == 56);
}

const Writer = struct {
    lock: std.fs.File,
    superblock: std.fs.File,
};

pub const Store = struct {
    dir: std.fs.Dir,
    path: []u8,
    threads: u32,
    verify_reads: bool,
    snapshot: std.atomic.Value(*Snapshot),
    in_flight: std.atomic.Value(u64),
    /// Serializes writers, refreshes and the retired lists within a process.
    mutex: std.Thread.Mutex = .{},
    retired_snapshots: std.ArrayList(*Snapshot) = .empty,
    retired_mappings: std.ArrayList(*Mapping) = .empty,
    has_retired: std.atomic.Value(bool) = .init(false),
    dictionary: ?*codec.Dictionary = null,
    dictionary_file: u64 = 0,
    writer: ?Writer = null,

    // ---- open, refresh, close -------------------------------------------

    pub fn open(path: []const u8, threads: u32, verify_reads: bool) Error!*Store {
        status.clear();
        if (path.len == 0) return status.fail(error.InvalidArgument, "store path is empty", .{});
        const dir = try openOrCreateDir(path);
        errdefer @constCast(&dir).close();
        const store = allocator.create(Store) catch return error.OutOfMemory;
        errdefer allocator.destroy(store);
        const path_copy = allocator.dupe(u8, path) catch return error.OutOfMemory;
        errdefer allocator.free(path_copy);
        store.* = .{
            .dir = dir,
            .path = path_copy,
            .threads = if (threads == 0) codec.cpuCount() else threads,
            .verify_reads = verify_reads,
            .snapshot = undefined,
            .in_flight = .init(0),
        };
        try store.ensureSuperblock();
        errdefer if (store.dictionary) |dictionary| {
            dictionary.deinit();
            allocator.destroy(dictionary);
        };
        const snapshot = try store.loadSnapshot(null);
        store.snapshot = .init(snapshot);
        return store;
    }

    pub fn close(store: *Store) void {
        assert(store.in_flight.load(.seq_cst) == 0);
        const current = store.snapshot.load(.seq_cst);
        store.retire(current, null);
        store.reclaim();
        store.retired_snapshots.deinit(allocator);
        store.retired_mappings.deinit(allocator);
        if (store.dictionary) |dictionary| {
            dictionary.deinit();
            allocator.destroy(dictionary);
        }
        if (store.writer) |writer| {
            writer.superblock.close();
            writer.lock.close(); // Closing the descriptor releases the flock.
        }
        store.dir.close();
        allocator.free(store.path);
        allocator.destroy(store);
    }

    /// Picks up commits made by other processes since open or the last refresh.
    pub fn refresh(store: *Store) Error!void {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        if (store.writer != null) return; // The writer's view is the latest.
        const current = store.snapshot.load(.seq_cst);
        const next = try store.loadSnapshot(current);
        if (next == current) return;
        store.publish(next);
    }

    fn openOrCreateDir(path: []const u8) Error!std.fs.Dir {
        const cwd = std.fs.cwd();
        return cwd.openDir(path, .{ .iterate = true }) catch |err| switch (err) {
            error.FileNotFound => {
                cwd.makePath(path) catch |make_err| {
                    return status.fromOs(make_err, "cannot create store directory '{s}'", .{path});
                };
                return cwd.openDir(path, .{ .iterate = true }) catch |open_err| {
                    return status.fromOs(open_err, "cannot open store directory '{s}'", .{path});
                };
            },
            error.NotDir => status.fail(error.NotAStore, "'{s}' is a file, not a store directory", .{path}),
            else => status.fromOs(err, "cannot open store directory '{s}'", .{path}),
        };
    }

    /// Creates the superblock of an empty store unless one exists. Refuses a
    /// directory that holds store files but no superblock: that store is damaged.
    fn ensureSuperblock(store: *Store) Error!void {
        if (store.dir.access("superblock", .{})) |_| {
            return;
        } else |_| {}
        var iterator = store.dir.iterate();
        while (iterator.next() catch |err| return status.fromOs(err, "cannot list '{s}'", .{store.path})) |item| {
            if (format.parseFileName(item.name) != null) {
                return status.fail(error.Corrupt, "store '{s}' has data files but no superblock; it is damaged", .{store.path});
            }
        }
        // Written whole under a temporary name, then linked into place, so
        // a crash never leaves a half-written superblock; link() fails if
        // another process created the store first, and then theirs stands.
        var temp_buffer: [64]u8 = undefined;
        const temp = std.fmt.bufPrint(&temp_buffer, "superblock.tmp-{d}", .{std.os.linux.getpid()}) catch unreachable;
        const file = store.dir.createFile(temp, .{ .exclusive = false }) catch |err| {
            return status.fromOs(err, "cannot create a store in '{s}'", .{store.path});
        };
        defer store.dir.deleteFile(temp) catch {};
        defer file.close();
        var superblock = Superblock.empty();
        superblock.seal();
        var slots = [_]u8{0} ** format.superblock_file_bytes;
        @memcpy(slots[0..@sizeOf(Superblock)], std.mem.asBytes(&superblock));
        file.pwriteAll(&slots, 0) catch |err| return status.fromOs(err, "cannot write the superblock of '{s}'", .{store.path});
        file.sync() catch |err| return status.fromOs(err, "cannot sync the superblock of '{s}'", .{store.path});
        posix.linkat(store.dir.fd, temp, store.dir.fd, "superblock", 0) catch |err| switch (err) {
            error.PathAlreadyExists => return,
            else => return status.fromOs(err, "cannot create a store in '{s}'", .{store.path}),
        };
        posix.fsync(store.dir.fd) catch |err| return status.fromOs(err, "cannot sync directory '{s}'", .{store.path});
    }

    /// Reads the newest sound superblock slot.
    fn readSuperblock(store: *Store) Error!Superblock {
        const file = store.dir.openFile("superblock", .{}) catch |err| switch (err) {
            error.FileNotFound => return status.fail(error.NotAStore, "'{s}' has no superblock; it is not a zrecord store", .{store.path}),
            else => return status.fromOs(err, "cannot open the superblock of '{s}'", .{store.path}),
        };
        defer file.close();
        var bytes: [format.superblock_file_bytes]u8 = undefined;
        const read = file.preadAll(&bytes, 0) catch |err| return status.fromOs(err, "cannot read the superblock of '{s}'", .{store.path});
        var best: ?Superblock = null;
        var reasons: [2][]const u8 = .{ "truncated", "truncated" };
        for (0..2) |slot| {
            const start = slot * format.slot_bytes;
            if (read < start + @sizeOf(Superblock)) continue;
            const candidate = std.mem.bytesToValue(Superblock, bytes[start..][0..@sizeOf(Superblock)]);
            if (candidate.invalidReason()) |reason| {
                reasons[slot] = reason;
                continue;
            }
            if (best == null or candidate.generation > best.?.generation) best = candidate;
        }
        // A sound slot of another version means another loaderx wrote here:
        // reading the older slot would silently drop its commits.
        if (std.mem.eql(u8, reasons[0], "unsupported version") or std.mem.eql(u8, reasons[1], "unsupported version")) {
            return status.fail(error.UnsupportedVersion, "store '{s}' has an on-disk format version this loaderx cannot read (it reads version {d}); upgrade loaderx", .{ store.path, format.version });
        }
        if (best) |superblock| return superblock;
        if (std.mem.eql(u8, reasons[0], "wrong magic") and std.mem.eql(u8, reasons[1], "wrong magic")) {
            return status.fail(error.NotAStore, "'{s}' is not a zrecord store (its superblock has the wrong magic)", .{store.path});
        }
        return status.fail(error.Corrupt, "store '{s}' is damaged: both superblock slots are unusable ({s}; {s})", .{ store.path, reasons[0], reasons[1] });
    }

    /// Reads the superblock and builds its snapshot, or returns `current` if
    /// nothing changed. A reader can race a writer that replaces files, so a
    /// missing file means "read the superblock again", a few times at most.
    fn loadSnapshot(store: *Store, current: ?*Snapshot) Error!*Snapshot {
        const attempts_max = 8;
        var attempt: u32 = 0;
        while (true) : (attempt += 1) {
            const superblock = try store.readSuperblock();
            if (current) |snapshot| {
                if (snapshot.superblock.generation == superblock.generation) return snapshot;
            }
            return store.buildSnapshot(superblock, current) catch |err| switch (err) {
                error.NotFound => {
                    if (attempt + 1 < attempts_max) continue;
                    var detail: [256]u8 = undefined;
                    const message = status.message();
                    const kept = message[0..@min(message.len, detail.len)];
                    @memcpy(detail[0..kept.len], kept);
                    return status.fail(error.Corrupt, "store '{s}' is damaged: {s}", .{ store.path, detail[0..kept.len] });
                },
                else => return err,
            };
        }
    }

    fn buildSnapshot(store: *Store, superblock: Superblock, previous: ?*const Snapshot) Error!*Snapshot {
        assert(superblock.invalidReason() == null);
        const snapshot = allocator.create(Snapshot) catch return error.OutOfMemory;
        snapshot.* = .{ .superblock = superblock };
        errdefer store.discardSnapshot(snapshot, previous);
        const old: [3]?*Mapping = if (previous) |p| p.mappings() else .{ null, null, null };
        switch (superblock.getLayout()) {
            .empty => {},
            .fixed => {
                snapshot.data = try store.mapFile(.data, superblock.data_file, superblock.data_bytes, old[0]);
                const sums_bytes = (superblock.data_bytes / block_bytes) * 8;
                snapshot.sums = try store.mapFile(.sums, superblock.sums_file, sums_bytes, old[2]);
            },
            .indexed => {
                snapshot.data = try store.mapFile(.data, superblock.data_file, superblock.data_bytes, old[0]);
                const index_bytes = superblock.record_count * @sizeOf(Entry);
                snapshot.index = try store.mapFile(.index, superblock.index_file, index_bytes, old[1]);
            },
        }
        if (superblock.dict_file != 0) snapshot.dictionary = try store.loadDictionary(superblock);
        return snapshot;
    }

    /// Frees a snapshot that was never published, and the mappings it does
    /// not share with `previous`.
    fn discardSnapshot(store: *Store, snapshot: *Snapshot, previous: ?*const Snapshot) void {
        _ = store;
        const old: [3]?*Mapping = if (previous) |p| p.mappings() else .{ null, null, null };
        for (snapshot.mappings(), old) |mapping, shared| {
            if (mapping) |m| if (m != shared) m.destroy();
        }
        allocator.destroy(snapshot);
    }

    fn mapFile(store: *Store, kind: format.FileKind, id: u64, needed: u64, reuse: ?*Mapping) Error!*Mapping {
        if (reuse) |mapping| {
            if (mapping.id == id and mapping.memory.len >= needed) return mapping;
        }
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const name = format.fileName(&name_buffer, kind, id);
        const file = store.dir.openFile(name, .{}) catch |err| switch (err) {
            error.FileNotFound => return status.fail(error.NotFound, "file '{s}' is missing", .{name}),
            else => return status.fromOs(err, "cannot open '{s}' in '{s}'", .{ name, store.path }),
        };
        errdefer file.close();
        const size = file.getEndPos() catch |err| return status.fromOs(err, "cannot stat '{s}'", .{name});
        if (size < needed) {
            return status.fail(error.Corrupt, "store '{s}' is damaged: '{s}' holds {d} bytes but the superblock needs {d}", .{ store.path, name, size, needed });
        }
        const reserve_min: u64 = 64 << 20;
        const grown = std.math.add(u64, needed, needed / 2) catch needed;
        const reserve = std.mem.alignForward(u64, @max(reserve_min, grown), page_size);
        const memory = posix.mmap(null, reserve, posix.PROT.READ, .{ .TYPE = .SHARED }, file.handle, 0) catch |err| {
            return status.fromOs(err, "cannot map '{s}' ({d} bytes)", .{ name, reserve });
        };
        errdefer posix.munmap(memory);
        // Loaders read records at random: readahead around each fault would
        // pull in megabytes per record from a cold disk. Long runs are read
        // with pread (fixed layout) or get an explicit WILLNEED (`prefetch`).
        if (kind == .data) posix.madvise(@constCast(memory.ptr), memory.len, posix.MADV.RANDOM) catch {};
        const mapping = allocator.create(Mapping) catch return error.OutOfMemory;
        mapping.* = .{ .file = file, .memory = memory, .id = id };
        return mapping;
    }

    fn loadDictionary(store: *Store, superblock: Superblock) Error!*const codec.Dictionary {
        if (store.dictionary) |dictionary| {
            if (store.dictionary_file == superblock.dict_file) return dictionary;
            return status.fail(error.Corrupt, "store '{s}' names a different dictionary than the one loaded", .{store.path});
        }
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const name = format.fileName(&name_buffer, .dict, superblock.dict_file);
        const file = store.dir.openFile(name, .{}) catch |err| switch (err) {
            error.FileNotFound => return status.fail(error.NotFound, "file '{s}' is missing", .{name}),
            else => return status.fromOs(err, "cannot open '{s}'", .{name}),
        };
        defer file.close();
        const bytes = allocator.alloc(u8, superblock.dict_bytes) catch return error.OutOfMemory;
        defer allocator.free(bytes);
        const read = file.preadAll(bytes, 0) catch |err| return status.fromOs(err, "cannot read '{s}'", .{name});
        if (read != bytes.len or format.hash(0, bytes) != superblock.dict_checksum) {
            return status.fail(error.Corrupt, "store '{s}' is damaged: dictionary '{s}' fails its checksum", .{ store.path, name });
        }
        const dictionary = allocator.create(codec.Dictionary) catch return error.OutOfMemory;
        errdefer allocator.destroy(dictionary);
        dictionary.* = try codec.Dictionary.init(bytes);
        store.dictionary = dictionary;
        store.dictionary_file = superblock.dict_file;
        return dictionary;
    }

    /// Makes `next` current. Caller holds the mutex.
    fn publish(store: *Store, next: *Snapshot) void {
        const previous = store.snapshot.swap(next, .seq_cst);
        store.retire(previous, next);
        store.reclaim();
    }

    fn retire(store: *Store, old: *Snapshot, next: ?*const Snapshot) void {
        const kept: [3]?*Mapping = if (next) |n| n.mappings() else .{ null, null, null };
        for (old.mappings()) |mapping| {
            const m = mapping orelse continue;
            if (m == kept[0] or m == kept[1] or m == kept[2]) continue;
            store.retired_mappings.append(allocator, m) catch {
                // Without room to defer the unmap we must keep it mapped: leak
                // it rather than unmap under a reader.
            };
        }
        store.retired_snapshots.append(allocator, old) catch {};
        store.has_retired.store(true, .seq_cst);
    }

    /// Frees retired snapshots and mappings when no gather can still see them.
    /// A gather counts itself in before it loads the snapshot pointer, so one
    /// that started after the swap sees the new snapshot.
    fn reclaim(store: *Store) void {
        if (store.in_flight.load(.seq_cst) != 0) return;
        store.has_retired.store(false, .seq_cst);
        for (store.retired_mappings.items) |mapping| mapping.destroy();
        store.retired_mappings.clearRetainingCapacity();
        for (store.retired_snapshots.items) |snapshot| allocator.destroy(snapshot);
        store.retired_snapshots.clearRetainingCapacity();
    }

    fn acquire(store: *Store) *Snapshot {
        _ = store.in_flight.fetchAdd(1, .seq_cst);
        return store.snapshot.load(.seq_cst);
    }

    /// The last reader out frees what writers retired meanwhile, so a store
    /// that is read without pause while it is written does not pile up old
    /// snapshots until the next quiet commit.
    fn release(store: *Store) void {
        const before = store.in_flight.fetchSub(1, .seq_cst);
        assert(before > 0);
        if (before == 1 and store.has_retired.load(.seq_cst) and store.mutex.tryLock()) {
            defer store.mutex.unlock();
            store.reclaim();
        }
    }

    // ---- reads ----------------------------------------------------------

    pub fn count(store: *Store) u64 {
        const snapshot = store.acquire();
        defer store.release();
        return snapshot.count();
    }

    pub fn info(store: *Store) Info {
        const snapshot = store.acquire();
        defer store.release();
        const superblock = snapshot.superblock;
        return .{
            .records = superblock.record_count,
            .live_bytes = superblock.live_bytes,
            .chunk_bytes = superblock.data_bytes,
            .reclaimable = superblock.data_bytes - superblock.live_bytes,
            .record_bytes = superblock.record_bytes,
            .generation = superblock.generation,
            .layout = superblock.layout,
            .has_dict = @intFromBool(superblock.dict_file != 0),
        };
    }

    pub fn lengths(store: *Store, indices: []const u64, out: []u64) Error!void {
        status.clear();
        assert(indices.len == out.len);
        const snapshot = store.acquire();
        defer store.release();
        try checkIndices(snapshot, indices);
        for (indices, out) |index, *length| {
            length.* = try snapshot.recordLength(index);
            if (store.verify_reads and !recordSound(snapshot, index)) {
                return status.fail(error.ChecksumMismatch, "record {d}: checksum mismatch (the record or its index entry is damaged)", .{index});
            }
        }
    }

    /// Decodes records `indices` into `target`: record k at byte
    /// `target_offsets[k]` or, without offsets, at `k * length` when all the
    /// records share one length.
    pub fn gather(
        store: *Store,
        indices: []const u64,
        target: []u8,
        target_offsets: ?[]const u64,
    ) Error!void {
        status.clear();
        const snapshot = store.acquire();
        defer store.release();
        try checkIndices(snapshot, indices);
        // Without offsets every record must have the first one's length.
        const target_stride = if (indices.len == 0) 0 else try snapshot.recordLength(indices[0]);
        var total_bytes: u64 = 0;
        for (indices, 0..) |index, k| {
            const length = try snapshot.recordLength(index);
            if (target_offsets == null and length != target_stride) {
                return status.fail(error.InvalidArgument, "record {d} has {d} bytes but record {d} has {d}: records of different lengths need explicit destination offsets", .{ index, length, indices[0], target_stride });
            }
            const start = if (target_offsets) |offsets| offsets[k] else std.math.mul(u64, k, target_stride) catch std.math.maxInt(u64);
            const end = std.math.add(u64, start, length) catch std.math.maxInt(u64);
            if (end > target.len) {
                return status.fail(error.BufferTooSmall, "record {d} ({d} bytes) does not fit the destination at offset {d}: the destination has {d} bytes", .{ index, length, start, target.len });
            }
            total_bytes += length;
        }
        var job = GatherJob{
            .snapshot = snapshot,
            .indices = indices,
            .target = target,
            .target_offsets = target_offsets,
            .target_stride = target_stride,
            .verify_reads = store.verify_reads,
        };
        codec.parallelFor(indices.len, total_bytes, store.threads, &job, GatherJob.run);
        try job.failure.check("cannot read");
    }

    /// Appends to `out` the indices in [start, end) whose bytes fail their
    /// checksum (or whose entry is unusable). Returns how many it found.
    pub fn verify(store: *Store, start: u64, end: u64, out: []u64) Error!u64 {
        status.clear();
        const snapshot = store.acquire();
        defer store.release();
        if (start > end or end > snapshot.count()) {
            return status.fail(error.IndexOutOfRange, "verify range [{d}, {d}) is outside a store of {d} records", .{ start, end, snapshot.count() });
        }
        assert(out.len >= end - start);
        var found: u64 = 0;
        for (start..end) |index| {
            if (!recordSound(snapshot, index)) {
                out[found] = index;
                found += 1;
            }
        }
        return found;
    }

    fn checkIndices(snapshot: *const Snapshot, indices: []const u64) Error!void {
        const limit = snapshot.count();
        for (indices) |index| {
            if (index >= limit) {
                return status.fail(error.IndexOutOfRange, "index {d} is out of range for a store of {d} records", .{ index, limit });
            }
        }
    }

    // ---- writes ---------------------------------------------------------

    /// Appends the records packed in `source` (record k starts at
    /// `offsets[k]`, the last runs to the end). Returns the first new index.
    pub fn append(store: *Store, source: []const u8, offsets: []const u64, record_codec: Codec) Error!u64 {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        try checkBatch(source, offsets);
        try store.beginWrite();
        const current = store.head();
        const first = current.count();
        if (first + offsets.len > format.record_count_max) {
            return status.fail(error.TooLarge, "a store holds at most {d} records", .{format.record_count_max});
        }
        try checkCodec(current, record_codec);
        const length = uniformLength(source, offsets);
        const superblock = current.superblock;
        const fits_fixed = record_codec == .raw and length != null and switch (superblock.getLayout()) {
            .empty => true,
            .fixed => length.? == superblock.record_bytes,
            .indexed => false,
        };
        if (fits_fixed) {
            try store.appendFixed(source[offsets[0]..], offsets.len, length.?);
        } else {
            if (superblock.getLayout() == .fixed) try store.convertToIndexed();
            try store.appendIndexed(source, offsets, record_codec);
        }
        assert(store.head().count() == first + offsets.len);
        return first;
    }

    /// Gives records `indices` new contents, packed like `append`'s.
    pub fn replace(store: *Store, indices: []const u64, source: []const u8, offsets: []const u64, record_codec: Codec) Error!void {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        if (indices.len != offsets.len) {
            return status.fail(error.InvalidArgument, "replace got {d} indices but {d} records", .{ indices.len, offsets.len });
        }
        try checkBatch(source, offsets);
        try store.beginWrite();
        const current = store.head();
        try checkIndices(current, indices);
        try checkCodec(current, record_codec);
        const sorted = try sortedCopy(indices);
        defer allocator.free(sorted);
        for (sorted[1..], sorted[0 .. sorted.len - 1]) |next, previous| {
            if (next == previous) {
                return status.fail(error.InvalidArgument, "index {d} appears twice; replace each record at most once per call", .{next});
            }
        }
        const length = uniformLength(source, offsets);
        const superblock = current.superblock;
        if (superblock.getLayout() == .fixed and record_codec == .raw and length != null and length.? == superblock.record_bytes) {
            try store.replaceFixed(indices, source, offsets);
        } else {
            if (superblock.getLayout() == .fixed) try store.convertToIndexed();
            try store.replaceIndexed(indices, source, offsets, record_codec);
        }
    }

    /// Deletes records `indices` (repeats allowed). With `keep_order` the
    /// survivors keep their order; otherwise the tail fills each hole: the
    /// surviving records past the new end move, in ascending order, into the
    /// holes below it, in ascending order (repeated swap-remove).
    pub fn delete(store: *Store, indices: []const u64, keep_order: bool) Error!void {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        try store.beginWrite();
        const current = store.head();
        try checkIndices(current, indices);
        if (indices.len == 0) return status.fail(error.InvalidArgument, "delete got no indices", .{});
        const doomed = try sortedCopy(indices);
        defer allocator.free(doomed);
        const unique = dedupe(doomed);
        const plan = DeletePlan.init(current, unique, keep_order);
        switch (current.layout()) {
            .fixed => try store.rewriteFixed(plan.remaining, &plan),
            .indexed => try store.rewriteIndex(plan.remaining, &plan, current.superblock.live_bytes - try deletedBytes(current, unique)),
            .empty => unreachable, // checkIndices refused every index.
        }
        assert(store.head().count() == plan.remaining);
    }

    /// Rewrites the live records of an indexed store into new files, dropping
    /// the bytes of deleted and replaced records.
    pub fn compact(store: *Store) Error!void {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        try store.beginWrite();
        const current = store.head();
        if (current.layout() != .indexed) return;
        if (current.superblock.live_bytes == current.superblock.data_bytes) return;
        try store.compactIndexed(current);
    }

    /// Makes every commit so far durable.
    pub fn sync(store: *Store) Error!void {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        const writer = store.writer orelse return;
        writer.superblock.sync() catch |err| return status.fromOs(err, "cannot sync '{s}'", .{store.path});
    }

    pub fn trainDict(store: *Store, samples: []const u8, sizes: []const u64, target_bytes: u64) Error!u64 {
        status.clear();
        store.mutex.lock();
        defer store.mutex.unlock();
        try store.beginWrite();
        const current = store.head();
        if (current.superblock.dict_file != 0) {
            return status.fail(error.DictionaryExists, "store '{s}' already has a dictionary; records compressed with it need it, so it cannot be replaced", .{store.path});
        }
        if (target_bytes < 256 or target_bytes > format.dict_bytes_max) {
            return status.fail(error.InvalidArgument, "dictionary size must be 256 B to {d} B, got {d}", .{ format.dict_bytes_max, target_bytes });
        }
        var total: u64 = 0;
        for (sizes) |size| total = std.math.add(u64, total, size) catch std.math.maxInt(u64);
        if (total != samples.len or sizes.len == 0 or sizes.len > std.math.maxInt(c_uint)) {
            return status.fail(error.InvalidArgument, "train_dict: sample sizes sum to {d} but the samples hold {d} bytes", .{ total, samples.len });
        }
        const buffer = allocator.alloc(u8, target_bytes) catch return error.OutOfMemory;
        defer allocator.free(buffer);
        const trained = zstd.ZDICT_trainFromBuffer(buffer.ptr, buffer.len, samples.ptr, sizes.ptr, @intCast(sizes.len));
        if (zstd.ZDICT_isError(trained) != 0) {
            return status.fail(error.Codec, "dictionary training failed ({s}); give more and more varied samples (zstd wants about 100x the dictionary size)", .{zstd.ZSTD_getErrorName(trained)});
        }
        const bytes = buffer[0..trained];
        var next = current.superblock;
        next.dict_file = next.generation + 1;
        next.dict_bytes = bytes.len;
        next.dict_checksum = format.hash(0, bytes);
        const file = try store.createFile(.dict, next.dict_file);
        defer file.close();
        try store.writeAt(file, bytes, 0);
        try store.syncFile(file);
        try store.syncDir();
        try store.commit(next, true);
        return bytes.len;
    }

    // ---- write helpers --------------------------------------------------

    fn head(store: *Store) *Snapshot {
        return store.snapshot.load(.seq_cst);
    }

    /// Takes the writer lock on first use, then discards what a crashed writer
    /// left past the committed state.
    fn beginWrite(store: *Store) Error!void {
        if (store.writer != null) return;
        const lock = store.dir.createFile("lock", .{ .read = true, .truncate = false }) catch |err| {
            return status.fromOs(err, "cannot write store '{s}' (cannot create its lock file)", .{store.path});
        };
        errdefer lock.close();
        const locked = lock.tryLock(.exclusive) catch |err| return status.fromOs(err, "cannot lock store '{s}'", .{store.path});
        if (!locked) {
            return status.fail(error.Locked, "store '{s}' is open for writing by another process or handle; zrecord allows one writer per store: close the other writer first", .{store.path});
        }
        const superblock = store.dir.openFile("superblock", .{ .mode = .read_write }) catch |err| {
            return status.fromOs(err, "cannot open the superblock of '{s}' for writing", .{store.path});
        };
        errdefer superblock.close();
        const latest = try store.loadSnapshot(store.head());
        if (latest != store.head()) store.publish(latest);
        store.writer = .{ .lock = lock, .superblock = superblock };
        try store.recover();
    }

    /// Truncates the current files to their committed lengths and deletes
    /// files no committed superblock names (left by an interrupted writer).
    /// Before deleting, the latest superblock is made durable: once older
    /// files are gone, a power loss must not fall back to a superblock that
    /// names them.
    fn recover(store: *Store) Error!void {
        const superblock = store.head().superblock;
        const keep = [_]struct { kind: format.FileKind, id: u64, bytes: u64 }{
            .{ .kind = .data, .id = superblock.data_file, .bytes = superblock.data_bytes },
            .{ .kind = .index, .id = superblock.index_file, .bytes = superblock.record_count * @sizeOf(Entry) },
            .{ .kind = .sums, .id = superblock.sums_file, .bytes = (superblock.data_bytes / block_bytes) * 8 },
            .{ .kind = .dict, .id = superblock.dict_file, .bytes = superblock.dict_bytes },
        };
        const Orphan = struct { kind: format.FileKind, id: u64 };
        var orphans: std.ArrayList(Orphan) = .empty;
        defer orphans.deinit(allocator);
        var iterator = store.dir.iterate();
        while (iterator.next() catch |err| return status.fromOs(err, "cannot list '{s}'", .{store.path})) |item| {
            const parsed = format.parseFileName(item.name) orelse continue;
            const wanted = for (keep) |file| {
                if (file.kind == parsed.kind and file.id == parsed.id) break true;
            } else false;
            if (wanted or parsed.id == 0) continue;
            orphans.append(allocator, .{ .kind = parsed.kind, .id = parsed.id }) catch return error.OutOfMemory;
        }
        var synced = false;
        for (keep) |file| {
            if (file.id == 0) continue;
            const handle = try store.openFile(file.kind, file.id);
            defer handle.close();
            const size = handle.getEndPos() catch |err| return status.fromOs(err, "cannot stat a file of '{s}'", .{store.path});
            // Committed lengths of a file only grow, so cutting past the
            // latest one never cuts what an older superblock points at.
            if (size > file.bytes) {
                handle.setEndPos(file.bytes) catch |err| return status.fromOs(err, "cannot truncate a file of '{s}'", .{store.path});
            }
        }
        for (orphans.items) |orphan| {
            if (!synced) try store.syncFile(store.writer.?.superblock);
            synced = true;
            var name_buffer: [format.file_name_bytes]u8 = undefined;
            const name = format.fileName(&name_buffer, orphan.kind, orphan.id);
            store.dir.deleteFileZ(name) catch |err| return status.fromOs(err, "cannot delete a stale file of '{s}'", .{store.path});
        }
    }

    fn commit(store: *Store, next_in: Superblock, durable: bool) Error!void {
        const writer = store.writer.?;
        const previous = store.head();
        var next = next_in;
        next.generation = previous.superblock.generation + 1;
        next.seal();
        assert(next.invalidReason() == null);
        const snapshot = try store.buildSnapshot(next, previous);
        errdefer store.discardSnapshot(snapshot, previous);
        const slot = (next.generation % 2) * format.slot_bytes;
        writer.superblock.pwriteAll(std.mem.asBytes(&next), slot) catch |err| {
            return status.fromOs(err, "cannot write the superblock of '{s}'", .{store.path});
        };
        if (durable) {
            writer.superblock.sync() catch |err| return status.fromOs(err, "cannot sync the superblock of '{s}'", .{store.path});
        }
        store.publish(snapshot);
    }

    /// Deletes files the current superblock no longer names. Only called after
    /// a durable commit, so a crash never falls back to a deleted file.
    fn unlinkReplaced(store: *Store, old: Superblock) void {
        const now = store.head().superblock;
        const pairs = [_]struct { kind: format.FileKind, old: u64, now: u64 }{
            .{ .kind = .data, .old = old.data_file, .now = now.data_file },
            .{ .kind = .index, .old = old.index_file, .now = now.index_file },
            .{ .kind = .sums, .old = old.sums_file, .now = now.sums_file },
        };
        for (pairs) |pair| {
            if (pair.old == 0 or pair.old == pair.now) continue;
            var name_buffer: [format.file_name_bytes]u8 = undefined;
            // A failure here leaves an orphan that the next writer deletes.
            store.dir.deleteFileZ(format.fileName(&name_buffer, pair.kind, pair.old)) catch {};
        }
    }

    fn createFile(store: *Store, kind: format.FileKind, id: u64) Error!std.fs.File {
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const name = format.fileName(&name_buffer, kind, id);
        return store.dir.createFile(name, .{ .read = true, .truncate = true }) catch |err| {
            return status.fromOs(err, "cannot create '{s}' in '{s}'", .{ name, store.path });
        };
    }

    fn openFile(store: *Store, kind: format.FileKind, id: u64) Error!std.fs.File {
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const name = format.fileName(&name_buffer, kind, id);
        return store.dir.openFile(name, .{ .mode = .read_write }) catch |err| {
            return status.fromOs(err, "cannot open '{s}' in '{s}' for writing", .{ name, store.path });
        };
    }

    fn writeAt(store: *Store, file: std.fs.File, bytes: []const u8, offset: u64) Error!void {
        file.pwriteAll(bytes, offset) catch |err| {
            return status.fromOs(err, "cannot write to store '{s}'", .{store.path});
        };
    }

    fn syncFile(store: *Store, file: std.fs.File) Error!void {
        file.sync() catch |err| return status.fromOs(err, "cannot sync store '{s}'", .{store.path});
    }

    fn syncDir(store: *Store) Error!void {
        posix.fsync(store.dir.fd) catch |err| return status.fromOs(err, "cannot sync directory '{s}'", .{store.path});
    }

    fn appendFixed(store: *Store, payload: []const u8, record_count: u64, record_bytes: u64) Error!void {
        const current = store.head();
        var next = current.superblock;
        const creating = next.getLayout() == .empty;
        if (creating) {
            next.layout = @intFromEnum(Layout.fixed);
            next.record_bytes = record_bytes;
            next.data_file = next.generation + 1;
            next.sums_file = next.generation + 1;
        }
        const data = if (creating) try store.createFile(.data, next.data_file) else try store.openFile(.data, next.data_file);
        defer data.close();
        const sums_file = if (creating) try store.createFile(.sums, next.sums_file) else try store.openFile(.sums, next.sums_file);
        defer sums_file.close();

        const old_bytes = current.dataBytes();
        const new_bytes = old_bytes.len + payload.len;
        try store.writeAt(data, payload, old_bytes.len);
        // Blocks completed by this append get their checksums in the sums
        // file; the new partial tail block's checksum goes in the superblock.
        const first_block = old_bytes.len / block_bytes;
        const full_blocks = new_bytes / block_bytes;
        var scratch: [block_bytes]u8 = undefined;
        var sums_buffer: [256]u64 = undefined;
        var block = first_block;
        while (block < full_blocks) {
            const batch_end = @min(full_blocks, block + sums_buffer.len);
            for (block..batch_end) |b| {
                const bytes = assemble(old_bytes, payload, b * block_bytes, (b + 1) * block_bytes, &scratch);
                sums_buffer[b - block] = format.blockChecksum(b, bytes);
            }
            try store.writeAt(sums_file, std.mem.sliceAsBytes(sums_buffer[0 .. batch_end - block]), block * 8);
            block = batch_end;
        }
        next.tail_checksum = 0;
        if (new_bytes % block_bytes != 0) {
            const bytes = assemble(old_bytes, payload, full_blocks * block_bytes, new_bytes, &scratch);
            next.tail_checksum = format.blockChecksum(full_blocks, bytes);
        }
        try store.syncFile(data);
        try store.syncFile(sums_file);
        if (creating) try store.syncDir();
        next.record_count += record_count;
        next.data_bytes = new_bytes;
        next.live_bytes = new_bytes;
        try store.commit(next, false);
    }

    fn appendIndexed(store: *Store, source: []const u8, offsets: []const u64, record_codec: Codec) Error!void {
        const current = store.head();
        var next = current.superblock;
        const creating = next.getLayout() == .empty;
        if (creating) {
            next.layout = @intFromEnum(Layout.indexed);
            next.data_file = next.generation + 1;
            next.index_file = next.generation + 1;
        }
        var batch = try encodeBatch(store, current, source, offsets, record_codec, next.data_bytes);
        defer batch.deinit();
        const data = if (creating) try store.createFile(.data, next.data_file) else try store.openFile(.data, next.data_file);
        defer data.close();
        const index = if (creating) try store.createFile(.index, next.index_file) else try store.openFile(.index, next.index_file);
        defer index.close();
        try store.writeAt(data, batch.payload, next.data_bytes);
        try store.writeAt(index, std.mem.sliceAsBytes(batch.entries), next.record_count * @sizeOf(Entry));
        try store.syncFile(data);
        try store.syncFile(index);
        if (creating) try store.syncDir();
        next.record_count += offsets.len;
        next.data_bytes += batch.payload.len;
        next.live_bytes += batch.payload.len;
        try store.commit(next, false);
    }

    fn replaceFixed(store: *Store, indices: []const u64, source: []const u8, offsets: []const u64) Error!void {
        const current = store.head();
        const patches = allocator.alloc(Patch, indices.len) catch return error.OutOfMemory;
        defer allocator.free(patches);
        const stride = current.superblock.record_bytes;
        for (indices, offsets, patches) |index, offset, *patch| {
            patch.* = .{ .row = index, .bytes = source[offset..][0..stride] };
        }
        std.mem.sort(Patch, patches, {}, Patch.lessThan);
        const plan = PatchPlan{ .old = current.dataBytes(), .stride = stride, .patches = patches };
        try store.rewriteFixed(current.count(), &plan);
    }

    fn replaceIndexed(store: *Store, indices: []const u64, source: []const u8, offsets: []const u64, record_codec: Codec) Error!void {
        const current = store.head();
        var batch = try encodeBatch(store, current, source, offsets, record_codec, current.superblock.data_bytes);
        defer batch.deinit();
        const data = try store.openFile(.data, current.superblock.data_file);
        defer data.close();
        try store.writeAt(data, batch.payload, current.superblock.data_bytes);
        try store.syncFile(data);

        const patches = allocator.alloc(Patch, indices.len) catch return error.OutOfMemory;
        defer allocator.free(patches);
        var freed: u64 = 0;
        const old_entries = current.entries();
        for (indices, batch.entries, patches) |index, *entry, *patch| {
            patch.* = .{ .row = index, .bytes = std.mem.asBytes(entry) };
            freed += old_entries[index].storedBytes();
        }
        std.mem.sort(Patch, patches, {}, Patch.lessThan);
        const plan = PatchPlan{ .old = std.mem.sliceAsBytes(old_entries), .stride = @sizeOf(Entry), .patches = patches };
        // live_bytes counts the new payload; the data file grew by it too.
        var live = current.superblock.live_bytes - @min(freed, current.superblock.live_bytes) + batch.payload.len;
        live = @min(live, current.superblock.data_bytes + batch.payload.len);
        try store.rewriteIndexWithData(current.count(), &plan, live, current.superblock.data_bytes + batch.payload.len);
    }

    /// Writes a new data file (and block sums) for a fixed store from `plan`,
    /// commits it durably and deletes the old files.
    fn rewriteFixed(store: *Store, new_count: u64, plan: anytype) Error!void {
        const current = store.head();
        var next = current.superblock;
        const id = next.generation + 1;
        const data = try store.createFile(.data, id);
        defer data.close();
        const sums_file = try store.createFile(.sums, id);
        defer sums_file.close();
        const stride = next.record_bytes;
        const written = try store.streamRows(data, sums_file, new_count, stride, plan);
        try store.syncFile(data);
        try store.syncFile(sums_file);
        try store.syncDir();
        next.data_file = id;
        next.sums_file = id;
        next.record_count = new_count;
        next.data_bytes = written.bytes;
        next.live_bytes = written.bytes;
        next.tail_checksum = written.tail_checksum;
        try store.commit(next, true);
        store.unlinkReplaced(current.superblock);
    }

    fn rewriteIndex(store: *Store, new_count: u64, plan: anytype, live_bytes: u64) Error!void {
        try store.rewriteIndexWithData(new_count, plan, live_bytes, store.head().superblock.data_bytes);
    }

    fn rewriteIndexWithData(store: *Store, new_count: u64, plan: anytype, live_bytes: u64, data_bytes: u64) Error!void {
        const current = store.head();
        var next = current.superblock;
        const id = next.generation + 1;
        const index = try store.createFile(.index, id);
        defer index.close();
        _ = try store.streamRows(index, null, new_count, @sizeOf(Entry), plan);
        try store.syncFile(index);
        try store.syncDir();
        next.index_file = id;
        next.record_count = new_count;
        next.data_bytes = data_bytes;
        next.live_bytes = live_bytes;
        try store.commit(next, true);
        store.unlinkReplaced(current.superblock);
    }

    /// Turns a fixed store into an indexed one: one entry per record, pointing
    /// into the same data file. Committed durably on its own.
    fn convertToIndexed(store: *Store) Error!void {
        const current = store.head();
        assert(current.layout() == .fixed);
        const plan = ConvertPlan{ .old = current.dataBytes(), .stride = current.superblock.record_bytes };
        var next = current.superblock;
        const id = next.generation + 1;
        const index = try store.createFile(.index, id);
        defer index.close();
        _ = try store.streamRows(index, null, current.count(), @sizeOf(Entry), &plan);
        try store.syncFile(index);
        try store.syncDir();
        next.layout = @intFromEnum(Layout.indexed);
        next.index_file = id;
        next.record_bytes = 0;
        next.sums_file = 0;
        next.tail_checksum = 0;
        try store.commit(next, true);
        store.unlinkReplaced(current.superblock);
    }

    fn compactIndexed(store: *Store, current: *const Snapshot) Error!void {
        var next = current.superblock;
        const id = next.generation + 1;
        const data = try store.createFile(.data, id);
        defer data.close();
        const index = try store.createFile(.index, id);
        defer index.close();
        // The payloads stream into the new data file as the entries are made.
        var payloads = RowWriter.init(store, data, null) catch return error.OutOfMemory;
        defer payloads.deinit();
        var entries = RowWriter.init(store, index, null) catch return error.OutOfMemory;
        defer entries.deinit();
        const old_data = current.dataBytes();
        for (current.entries(), 0..) |old, k| {
            if (old.invalidReason(current.superblock.data_bytes)) |reason| {
                return status.fail(error.Corrupt, "cannot compact: record {d}: {s}", .{ k, reason });
            }
            var entry = old;
            entry.offset = payloads.position;
            try payloads.write(old_data[old.offset..][0..old.storedBytes()]);
            try entries.write(std.mem.asBytes(&entry));
        }
        const written = try payloads.finish();
        _ = try entries.finish();
        try store.syncFile(data);
        try store.syncFile(index);
        try store.syncDir();
        next.data_file = id;
        next.index_file = id;
        next.data_bytes = written.bytes;
        next.live_bytes = written.bytes;
        try store.commit(next, true);
        store.unlinkReplaced(current.superblock);
    }

    /// Writes `row_count` rows of `stride` bytes from `plan` into `file`,
    /// with block checksums into `sums_file` when given.
    fn streamRows(store: *Store, file: std.fs.File, sums_file: ?std.fs.File, row_count: u64, stride: u64, plan: anytype) Error!RowWriter.Written {
        var writer = RowWriter.init(store, file, sums_file) catch return error.OutOfMemory;
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
        return writer.finish();
    }
};

// ---- batch helpers -------------------------------------------------------------

fn checkBatch(source: []const u8, offsets: []const u64) Error!void {
    if (offsets.len == 0) return status.fail(error.InvalidArgument, "empty batch: give at least one record", .{});
    var previous: u64 = offsets[0];
    for (offsets, 0..) |offset, k| {
        if (offset < previous or offset > source.len) {
            return status.fail(error.InvalidArgument, "offsets[{d}] = {d} is not within [offsets[{d}], {d}]: offsets must be non-decreasing and inside the source", .{ k, offset, if (k == 0) 0 else k - 1, source.len });
        }
        previous = offset;
    }
    for (0..offsets.len) |k| {
        const length = recordLengthIn(source, offsets, k);
        if (length > format.record_bytes_max) {
            return status.fail(error.TooLarge, "record {d} has {d} bytes; the limit is {d}", .{ k, length, format.record_bytes_max });
        }
    }
}

fn checkCodec(snapshot: *const Snapshot, record_codec: Codec) Error!void {
    if (record_codec == .zstd_dict and snapshot.dictionary == null) {
        return status.fail(error.NoDictionary, "codec 'zstd_dict' needs a trained dictionary: call train_dict(samples, sizes, target) first", .{});
    }
}

fn recordLengthIn(source: []const u8, offsets: []const u64, k: usize) u64 {
    const end = if (k + 1 < offsets.len) offsets[k + 1] else source.len;
    return end - offsets[k];
}

fn uniformLength(source: []const u8, offsets: []const u64) ?u64 {
    const first = recordLengthIn(source, offsets, 0);
    for (1..offsets.len) |k| {
        if (recordLengthIn(source, offsets, k) != first) return null;
    }
    return first;
}

fn sortedCopy(indices: []const u64) Error![]u64 {
    const copy = allocator.dupe(u64, indices) catch return error.OutOfMemory;
    std.mem.sort(u64, copy, {}, std.sort.asc(u64));
    return copy;
}

fn dedupe(sorted: []u64) []u64 {
    if (sorted.len == 0) return sorted;
    var kept: usize = 1;
    for (sorted[1..]) |value| {
        if (value != sorted[kept - 1]) {
            sorted[kept] = value;
            kept += 1;
        }
    }
    return sorted[0..kept];
}

fn deletedBytes(snapshot: *const Snapshot, doomed: []const u64) Error!u64 {
    var total: u64 = 0;
    const entries = snapshot.entries();
    for (doomed) |index| total += entries[index].storedBytes();
    return @min(total, snapshot.superblock.live_bytes);
}

/// The bytes [start, end) of the file `old ++ payload`, copied into `scratch`
/// only when the range straddles the two.
fn assemble(old: []const u8, payload: []const u8, start: u64, end: u64, scratch: *[block_bytes]u8) []const u8 {
    assert(start <= end and end - start <= block_bytes);
    if (start >= old.len) return payload[start - old.len .. end - old.len];
    if (end <= old.len) return old[start..end];
    const head = old[start..];
    @memcpy(scratch[0..head.len], head);
    const tail = payload[0 .. end - old.len];
    @memcpy(scratch[head.len..][0..tail.len], tail);
    return scratch[0 .. end - start];
}

fn blockSound(snapshot: *const Snapshot, block: u64) bool {
    const data = snapshot.dataBytes();
    const start = block * block_bytes;
    const end = @min(start + block_bytes, data.len);
    const expected = if (block < data.len / block_bytes) snapshot.blockSums()[block] else snapshot.superblock.tail_checksum;
    return format.blockChecksum(block, data[start..end]) == expected;
}

/// Whether every block overlapping data bytes [start, start + bytes) holds.
fn fixedRangeSound(snapshot: *const Snapshot, start: u64, bytes: u64) bool {
    if (bytes == 0) return true;
    const first = start / block_bytes;
    const last = (start + bytes - 1) / block_bytes;
    for (first..last + 1) |block| {
        if (!blockSound(snapshot, block)) return false;
    }
    return true;
}

fn recordSound(snapshot: *const Snapshot, index: u64) bool {
    if (snapshot.layout() == .fixed) {
        const stride = snapshot.superblock.record_bytes;
        return fixedRangeSound(snapshot, index * stride, stride);
    }
    const entry = snapshot.entries()[index];
    if (entry.invalidReason(snapshot.superblock.data_bytes) != null) return false;
    const payload = snapshot.dataBytes()[entry.offset..][0..entry.storedBytes()];
    return entry.payloadChecksum(payload) == entry.checksum;
}

/// Below this a readahead hint costs more than the page faults it saves.
const prefetch_bytes_min = 64 * 1024;

/// Asks the kernel to read `bytes` of a mapping ahead, in one request, when
/// they are many: the data mapping is MADV_RANDOM, so nothing else would.
/// (Long runs of fixed records are read with pread instead.)
fn prefetch(bytes: []const u8) void {
    if (bytes.len < prefetch_bytes_min) return;
    const start = std.mem.alignBackward(usize, @intFromPtr(bytes.ptr), page_size);
    const end = @intFromPtr(bytes.ptr) + bytes.len;
    const pointer: [*]align(page_size) u8 = @ptrFromInt(start);
    posix.madvise(pointer, end - start, posix.MADV.WILLNEED) catch {};
}

const GatherJob = struct {
    snapshot: *const Snapshot,
    indices: []const u64,
    target: []u8,
    target_offsets: ?[]const u64,
    target_stride: u64,
    verify_reads: bool,
    failure: codec.Failure = .{},

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
            if (job.verify_reads and !fixedRangeSound(snapshot, first * stride, bytes)) {
                for (first..first + count) |index| {
                    if (!fixedRangeSound(snapshot, index * stride, stride)) {
                        return job.failure.set(error.ChecksumMismatch, index, "checksum mismatch (the data file is damaged)");
                    }
                }
            }
            const target = job.target[at..][0..bytes];
            if (bytes >= prefetch_bytes_min) {
                const read = snapshot.data.?.file.preadAll(target, first * stride) catch {
                    return job.failure.set(error.Io, first, "cannot read the data file");
                };
                if (read != bytes) return job.failure.set(error.Corrupt, first, "the data file is shorter than committed");
            } else {
                @memcpy(target, snapshot.dataBytes()[first * stride ..][0..bytes]);
            }
            k += count;
        }
    }

    fn targetAt(job: *const GatherJob, k: u64) u64 {
        return if (job.target_offsets) |offsets| offsets[k] else k * job.target_stride;
    }

    fn run(job: *GatherJob, start: u64, end: u64) void {
        if (job.snapshot.layout() == .fixed) return job.runFixed(start, end);
        var decoder: ?*zstd.DCtx = null;
        defer if (decoder) |d| codec.giveDecoder(d);
        const snapshot = job.snapshot;
        for (start..end) |k| {
            const index = job.indices[k];
            const at = job.targetAt(k);
            const entry = snapshot.entries()[index];
            // Lengths were validated by the caller; the snapshot is immutable.
            const payload = snapshot.dataBytes()[entry.offset..][0..entry.storedBytes()];
            prefetch(payload);
            if (job.verify_reads and entry.payloadChecksum(payload) != entry.checksum) {
                return job.failure.set(error.ChecksumMismatch, index, "checksum mismatch (the record is damaged)");
            }
            const record_codec = entry.codec().?;
            if (record_codec != .raw and decoder == null) {
                decoder = codec.takeDecoder() catch return job.failure.set(error.OutOfMemory, index, "out of memory for a zstd context");
            }
            codec.decode(decoder, record_codec, snapshot.dictionary, payload, job.target[at..][0..entry.raw_bytes]) catch |err| switch (err) {
                error.Corrupt => return job.failure.set(error.Corrupt, index, "the stored frame does not decode to the record's length (the store is damaged)"),
                error.NoDictionary => return job.failure.set(error.Corrupt, index, "record needs the store's dictionary, which is missing"),
            };
        }
    }
};

/// A batch encoded for appending: payloads packed back to back and one entry
/// per record, whose offsets start at `base`.
const EncodedBatch = struct {
    payload: []const u8,
    entries: []Entry,
    scratch: []u8,

    fn deinit(batch: *EncodedBatch) void {
        allocator.free(batch.entries);
        if (batch.scratch.len > 0) allocator.free(batch.scratch);
    }
};

const EncodeJob = struct {
    source: []const u8,
    offsets: []const u64,
    slots: []const u64,
    scratch: []u8,
    entries: []Entry,
    record_codec: Codec,
    dictionary: ?*const codec.Dictionary,
    failure: codec.Failure = .{},

    fn run(job: *EncodeJob, start: u64, end: u64) void {
        const encoder = codec.takeEncoder() catch return job.failure.set(error.OutOfMemory, start, "out of memory for a zstd context");
        defer codec.giveEncoder(encoder);
        for (start..end) |k| {
            const raw = job.source[job.offsets[k]..][0..recordLengthIn(job.source, job.offsets, k)];
            const slot = job.scratch[job.slots[k]..job.slots[k + 1]];
            const written = codec.compress(encoder, job.record_codec, job.dictionary, raw, slot) catch {
                return job.failure.set(error.Codec, k, "zstd could not compress the record");
            };
            // A frame that does not shrink the record is not worth decoding.
            job.entries[k] = if (written < raw.len)
                Entry.init(0, raw.len, written, job.record_codec, slot[0..written])
            else
                Entry.init(0, raw.len, raw.len, .raw, raw);
        }
    }
};

const HashJob = struct {
    source: []const u8,
    offsets: []const u64,
    entries: []Entry,

    fn run(job: *HashJob, start: u64, end: u64) void {
        for (start..end) |k| {
            const length = recordLengthIn(job.source, job.offsets, k);
            const raw = job.source[job.offsets[k]..][0..length];
            job.entries[k] = Entry.init(job.offsets[k] - job.offsets[0], length, length, .raw, raw);
        }
    }
};

fn encodeBatch(store: *Store, snapshot: *const Snapshot, source: []const u8, offsets: []const u64, record_codec: Codec, base: u64) Error!EncodedBatch {
    const entries = allocator.alloc(Entry, offsets.len) catch return error.OutOfMemory;
    errdefer allocator.free(entries);
    const total = source.len - offsets[0];
    if (record_codec == .raw) {
        var job = HashJob{ .source = source, .offsets = offsets, .entries = entries };
        codec.parallelFor(offsets.len, total, store.threads, &job, HashJob.run);
        for (entries) |*entry| entry.offset += base;
        return .{ .payload = source[offsets[0]..], .entries = entries, .scratch = &.{} };
    }
    const slots = allocator.alloc(u64, offsets.len + 1) catch return error.OutOfMemory;
    defer allocator.free(slots);
    slots[0] = 0;
    for (0..offsets.len) |k| {
        const bound = zstd.ZSTD_compressBound(recordLengthIn(source, offsets, k));
        slots[k + 1] = std.math.add(u64, slots[k], bound) catch return error.TooLarge;
    }
    const scratch = allocator.alloc(u8, slots[offsets.len]) catch return error.OutOfMemory;
    errdefer allocator.free(scratch);
    var job = EncodeJob{
        .source = source,
        .offsets = offsets,
        .slots = slots,
        .scratch = scratch,
        .entries = entries,
        .record_codec = record_codec,
        .dictionary = snapshot.dictionary,
    };
    codec.parallelFor(offsets.len, total, store.threads, &job, EncodeJob.run);
    try job.failure.check("cannot compress");
    // Pack the payloads back to back. Each lands at or before its slot, so
    // copying forwards never overwrites a payload not yet moved.
    var cursor: u64 = 0;
    for (entries, 0..) |*entry, k| {
        const stored = entry.storedBytes();
        assert(cursor <= slots[k]);
        if (entry.codec().? == .raw) {
            @memcpy(scratch[cursor..][0..stored], source[offsets[k]..][0..stored]);
        } else {
            std.mem.copyForwards(u8, scratch[cursor..][0..stored], scratch[slots[k]..][0..stored]);
        }
        entry.offset = base + cursor;
        cursor += stored;
    }
    return .{ .payload = scratch[0..cursor], .entries = entries, .scratch = scratch };
}

// ---- rewrite plans: where each row of a rewritten file comes from ---------------

const Patch = struct {
    row: u64,
    bytes: []const u8,

    fn lessThan(_: void, a: Patch, b: Patch) bool {
        return a.row < b.row;
    }
};

/// Row i is the patch for row i if there is one, else old row i.
const PatchPlan = struct {
    old: []const u8,
    stride: u64,
    patches: []const Patch,

    const Cursor = struct {
        plan: *const PatchPlan,
        next_patch: usize = 0,

        /// Rows from `row` on: one patch, or the old rows up to the next patch.
        fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            const patches = cursor.plan.patches;
            var run = rows_max;
            if (cursor.next_patch < patches.len) {
                const patch = patches[cursor.next_patch];
                if (patch.row == row) {
                    cursor.next_patch += 1;
                    return patch.bytes;
                }
                assert(patch.row > row);
                run = @min(run, patch.row - row);
            }
            const stride = cursor.plan.stride;
            return cursor.plan.old[row * stride ..][0 .. run * stride];
        }
    };

    fn begin(plan: *const PatchPlan) Cursor {
        return .{ .plan = plan };
    }
};

/// The rows that survive a delete: in order (keep_order), or with the tail's
/// survivors moved into the holes below the new end.
const DeletePlan = struct {
    old: []const u8,
    stride: u64,
    doomed: []const u64,
    remaining: u64,
    keep_order: bool,

    fn init(snapshot: *const Snapshot, doomed: []const u64, keep_order: bool) DeletePlan {
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
        fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            const plan = cursor.plan;
            const doomed = plan.doomed;
            if (plan.keep_order) {
                while (cursor.doomed_next < doomed.len and doomed[cursor.doomed_next] == cursor.old_row) {
                    cursor.doomed_next += 1;
                    cursor.old_row += 1;
                }
                var run = rows_max;
                if (cursor.doomed_next < doomed.len) run = @min(run, doomed[cursor.doomed_next] - cursor.old_row);
                cursor.old_row += run;
                return plan.oldRows(cursor.old_row - run, run);
            }
            const is_hole = cursor.doomed_next < doomed.len and doomed[cursor.doomed_next] == row;
            if (!is_hole) {
                var run = rows_max;
                if (cursor.doomed_next < doomed.len) run = @min(run, doomed[cursor.doomed_next] - row);
                return plan.oldRows(row, run);
            }
            cursor.doomed_next += 1;
            // The next survivor in the tail: skip tail rows that are doomed too.
            while (cursor.tail_doomed < doomed.len and doomed[cursor.tail_doomed] == cursor.old_row) {
                cursor.tail_doomed += 1;
                cursor.old_row += 1;
            }
            cursor.old_row += 1;
            return plan.oldRows(cursor.old_row - 1, 1);
        }
    };

    fn oldRows(plan: *const DeletePlan, old_row: u64, rows: u64) []const u8 {
        return plan.old[old_row * plan.stride ..][0 .. rows * plan.stride];
    }

    fn begin(plan: *const DeletePlan) Cursor {
        const first_tail = std.sort.lowerBound(u64, plan.doomed, plan.remaining, orderU64);
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

/// Entries for the records of a fixed store, checksummed from its data.
const ConvertPlan = struct {
    old: []const u8,
    stride: u64,

    const Cursor = struct {
        plan: *const ConvertPlan,
        entry: Entry = undefined,

        fn next(cursor: *Cursor, row: u64, rows_max: u64) []const u8 {
            assert(rows_max >= 1);
            const stride = cursor.plan.stride;
            const bytes = cursor.plan.old[row * stride ..][0..stride];
            cursor.entry = Entry.init(row * stride, stride, stride, .raw, bytes);
            return std.mem.asBytes(&cursor.entry);
        }
    };

    fn begin(plan: *const ConvertPlan) Cursor {
        return .{ .plan = plan };
    }
};

/// Buffered sequential writer of a new store file that computes the block
/// checksums of a fixed data file as it goes.
const RowWriter = struct {
    const buffer_bytes = 256 * block_bytes; // 4 MiB

    store: *Store,
    file: std.fs.File,
    sums_file: ?std.fs.File,
    buffer: []u8,
    fill: u64 = 0,
    /// File offset of the first byte not yet written (excludes the buffer).
    flushed: u64 = 0,
    /// File offset of the next byte written by `write`.
    position: u64 = 0,
    sums: [256]u64 = undefined,

    const Written = struct { bytes: u64, tail_checksum: u64 };

    fn init(store: *Store, file: std.fs.File, sums_file: ?std.fs.File) error{OutOfMemory}!RowWriter {
        const buffer = try allocator.alloc(u8, buffer_bytes);
        return .{ .store = store, .file = file, .sums_file = sums_file, .buffer = buffer };
    }

    fn deinit(writer: *RowWriter) void {
        allocator.free(writer.buffer);
    }

    fn write(writer: *RowWriter, bytes: []const u8) Error!void {
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
    }

    /// Writes the buffer; called only when it is full or at the end, so
    /// every flush but the last covers whole blocks.
    fn flush(writer: *RowWriter) Error!void {
        if (writer.sums_file) |sums_file| {
            const first_block = writer.flushed / block_bytes;
            const full = writer.fill / block_bytes;
            for (0..full) |k| {
                writer.sums[k] = format.blockChecksum(first_block + k, writer.buffer[k * block_bytes ..][0..block_bytes]);
            }
            try writer.store.writeAt(sums_file, std.mem.sliceAsBytes(writer.sums[0..full]), first_block * 8);
        }
        try writer.store.writeAt(writer.file, writer.buffer[0..writer.fill], writer.flushed);
        writer.flushed += writer.fill;
        writer.fill = 0;
    }

    fn finish(writer: *RowWriter) Error!Written {
        var tail_checksum: u64 = 0;
        const tail = writer.fill % block_bytes;
        if (tail != 0 and writer.sums_file != null) {
            const block = (writer.flushed + writer.fill) / block_bytes;
            tail_checksum = format.blockChecksum(block, writer.buffer[writer.fill - tail .. writer.fill]);
        }
        try writer.flush();
        assert(writer.flushed == writer.position);
        return .{ .bytes = writer.position, .tail_checksum = tail_checksum };
    }
};

// ---- tests -----------------------------------------------------------------------

const testing = std.testing;

fn testStorePath(buffer: []u8, name: []const u8) []const u8 {
    return std.fmt.bufPrint(buffer, "/tmp/zrecord-zig-test-{d}-{s}", .{ std.os.linux.getpid(), name }) catch unreachable;
}

test "append, gather and reopen round trip in both layouts" {
    var path_buffer: [128]u8 = undefined;
    const path = testStorePath(&path_buffer, "roundtrip");
    std.fs.cwd().deleteTree(path) catch {};
    defer std.fs.cwd().deleteTree(path) catch {};

    const store = try Store.open(path, 2, true);
    const source = "aaaabbbbcccc";
    const offsets = [_]u64{ 0, 4, 8 };
    try testing.expectEqual(@as(u64, 0), try store.append(source, &offsets, .raw));
    try testing.expectEqual(Layout.fixed, store.head().layout());
    // A record of another length turns the store indexed, keeping the old ones.
    try testing.expectEqual(@as(u64, 3), try store.append("dd", &.{0}, .zstd));
    try testing.expectEqual(Layout.indexed, store.head().layout());
    store.close();

    const reopened = try Store.open(path, 2, true);
    defer reopened.close();
    var target: [14]u8 = undefined;
    const indices = [_]u64{ 3, 0, 2, 1 };
    const target_offsets = [_]u64{ 0, 2, 6, 10 };
    try reopened.gather(&indices, &target, &target_offsets);
    try testing.expectEqualStrings("ddaaaaccccbbbb", &target);
}

test "delete in both modes matches repeated swap-remove and order-keeping removal" {
    var path_buffer: [128]u8 = undefined;
    const path = testStorePath(&path_buffer, "delete");
    std.fs.cwd().deleteTree(path) catch {};
    defer std.fs.cwd().deleteTree(path) catch {};

    for ([_]bool{ false, true }) |keep_order| {
        std.fs.cwd().deleteTree(path) catch {};
        const store = try Store.open(path, 1, true);
        defer store.close();
        const source = "0123456789";
        const offsets = [_]u64{ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 };
        _ = try store.append(source, &offsets, .raw);
        try store.delete(&.{ 8, 2, 5, 2 }, keep_order);
        var target: [7]u8 = undefined;
        try store.gather(&.{ 0, 1, 2, 3, 4, 5, 6 }, &target, null);
        // Holes below the new end (7) are 2 and 5; the tail's survivors 7 and
        // 9 fill them in order, as swap-remove of 8, 5, 2 would.
        try testing.expectEqualStrings(if (keep_order) "0134679" else "0173496", &target);
    }
}
