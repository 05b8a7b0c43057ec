//! zrecord: a persistent record store. This file is the store's public face:
//! open and close, each operation's checks and choice of layout, and the one
//! place the store's state changes: the layouts write files and return the
//! next superblock, and only this file commits and publishes it. What the
//! files hold is in format.zig; the rest lives in a file per concept:
//!
//!   io.zig          the I/O seam: every file-system call, every OS message
//!   superblock.zig  the two superblock slots: reading, creating, writing
//!   commit.zig      the commit protocol, the writer lock and recovery
//!   journal.zig     in-place replaces of the fixed layout: the redo
//!                   journal, its replay, and the readers' settle path
//!   seqlock.zig     the shared page of the lock file and its sequence lock
//!   snapshot.zig    what readers see, and when old mappings may go
//!   read.zig        batch gathers on the worker threads
//!   integrity.zig   checksums of blocks and records
//!   fixed.zig       the fixed layout (raw records of one length)
//!   indexed.zig     the indexed layout (an entry per record)
//!   encode.zig      compressing and checking a batch to append
//!   plans.zig       rewrite plans and the row writer
//!   workers.zig     the worker pool
//!
//! Imports go one way, without a cycle: store -> fixed, indexed -> commit
//! -> superblock, journal -> plans -> snapshot -> seqlock -> io -> format.
//!
//! Concurrency model. Readers never lock: a gather loads the current
//! snapshot and reads only bytes it committed. A writer (one per store,
//! across processes, by flock on `lock`) builds the next snapshot, commits
//! the superblock, and publishes the snapshot with one atomic swap.
const std = @import("std");
const format = @import("format.zig");
const codec = @import("codec.zig");
const status = @import("status.zig");
const clib = @import("clib.zig");
const io = @import("io.zig");
const superblock_file = @import("superblock.zig");
const commit = @import("commit.zig");
const snapshot_module = @import("snapshot.zig");
const read = @import("read.zig");
const integrity = @import("integrity.zig");
const fixed = @import("fixed.zig");
const indexed = @import("indexed.zig");
const encode = @import("encode.zig");
const plans = @import("plans.zig");
const workers = @import("workers.zig");
const journal = @import("journal.zig");
const undo = @import("undo.zig");
const seqlock = @import("seqlock.zig");
const changes = @import("changes.zig");

const assert = std.debug.assert;
const allocator = std.heap.c_allocator;
const Error = status.Error;
const Superblock = format.Superblock;
const Codec = format.Codec;
const Layout = format.Layout;
const Snapshot = snapshot_module.Snapshot;
const Snapshots = snapshot_module.Snapshots;

comptime {
    assert(@sizeOf(usize) == @sizeOf(u64));
}

pub const Info = extern struct {
    records: u64,
    live_bytes: u64,
    chunk_bytes: u64,
    reclaimable: u64,
    record_bytes: u64,
    generation: u64,
    layout: u32,
    has_dict: u32,
    /// 1 when open fell back to the older superblock slot because the newer
    /// one is damaged (a commit torn by a crash), until the next commit.
    fell_back: u32,
    /// 1 when the superblock is damaged, not torn: the store may have
    /// opened older than its last commit (`Store.damaged`).
    damaged: u32,
    /// The id in the name of the data file (`format.fileName`), 0: none. In
    /// a fixed raw store, record i is bytes [i, i + 1) * record_bytes of it.
    data_file: u64,
};

comptime {
    assert(@sizeOf(Info) == 72);
}

const fall_back_reason_bytes_max = 400;

pub const Store = struct {
    dir: io.Dir,
    path: []u8,
    threads: u32,
    verify_reads: bool,
    /// Check every record of the indexed layout on read (the default from
    /// Python): its checksum costs a fraction of reading the record. The
    /// fixed layout's checksums cover 16 KiB blocks, which a record read
    /// would have to hash whole, so only `verify_reads` checks those.
    verify_indexed_reads: bool = false,
    /// false: commits skip fsync until sync() or close() (still atomic
    /// through a process kill; see commit.zig).
    durable: bool,
    snapshots: Snapshots,
    fell_back: bool,
    /// The superblock is damaged in a way no crash leaves (`judgeSlots`):
    /// verify fails and writes are refused, so a writer's recovery does
    /// not cut what the lost commits wrote.
    damaged: bool = false,
    /// Why open fell back or found damage, for stats() and the CLI.
    fall_back_reason: [fall_back_reason_bytes_max]u8 = undefined,
    fall_back_reason_len: usize = 0,
    dictionary: ?*codec.Dictionary = null,
    dictionary_file: u64 = 0,
    writer: ?commit.Writer = null,
    /// A staged store's superblock, created unsynced, until `sync` or
    /// its first durable append syncs it.
    created_unsynced: bool = false,

    // ---- open, refresh, close -------------------------------------------

    /// Opens the store at `path`, creating it (and its parents) if missing.
    /// `threads` caps the threads one batch call runs on (0: one per core).
    pub fn open(path: []const u8, threads: u32, verify_reads: bool, durable: bool) Error!*Store {
        const store = try openWith(path, threads, verify_reads, durable, .create);
        assert(store.writer == null); // The first write takes the writer lock.
        return store;
    }

    /// What `openWith` does where it finds no store.
    pub const Missing = enum {
        create,
        /// A new directory that nobody opens until its owner renames it
        /// into place (ArrayStore's saves): its superblock is created
        /// without the three syncs that make an empty store durable;
        /// `sync` makes them, after the first commit's.
        create_staged,
        /// Fail with NotAStore: the caller opens what it knows is a store
        /// (a dataset's, whose schema it read), so no look-up first.
        refuse,
    };

    /// `open`, doing what `missing` says where it finds no store.
    pub fn openWith(
        path: []const u8,
        threads: u32,
        verify_reads: bool,
        durable: bool,
        missing: Missing,
    ) Error!*Store {
        status.clear();
        if (path.len == 0) return status.fail(error.InvalidArgument, "store path is empty", .{});
        const path_copy = allocator.dupe(u8, path) catch return error.OutOfMemory;
        errdefer allocator.free(path_copy);
        const dir = if (missing == .refuse)
            try io.openDir(path_copy)
        else
            try openOrCreateDir(path_copy);
        errdefer io.closeDir(dir);
        return openIn(dir, path_copy, threads, verify_reads, durable, missing);
    }

    /// `openWith` of an existing store (`.refuse`) that first reads the
    /// directory's file `side_name` (a dataset's schema) into `side`,
    /// through the one directory handle the store opens by: the file and
    /// the store are of one directory, however its path is swapped
    /// meanwhile. Returns the bytes read (fewer than `side.len` where the
    /// file ends) and the store; null, with no store opened, where the
    /// directory has no such file.
    pub fn openBeside(
        path: []const u8,
        threads: u32,
        verify_reads: bool,
        durable: bool,
        side_name: []const u8,
        side: []u8,
    ) Error!?struct { store: *Store, side_bytes: usize } {
        status.clear();
        if (path.len == 0) return status.fail(error.InvalidArgument, "store path is empty", .{});
        const path_copy = allocator.dupe(u8, path) catch return error.OutOfMemory;
        errdefer allocator.free(path_copy);
        const dir = try io.openDir(path_copy);
        errdefer io.closeDir(dir);
        const side_bytes = try io.readSmallFile(dir, side_name, side) orelse {
            io.closeDir(dir);
            allocator.free(path_copy);
            return null;
        };
        const store = try openIn(dir, path_copy, threads, verify_reads, durable, .refuse);
        return .{ .store = store, .side_bytes = side_bytes };
    }

    /// The store in the open directory `dir` of path `path_copy` (both
    /// its own on success; on failure the caller closes and frees them).
    fn openIn(
        dir: io.Dir,
        path_copy: []u8,
        threads: u32,
        verify_reads: bool,
        durable: bool,
        missing: Missing,
    ) Error!*Store {
        assert(dir.path.ptr == path_copy.ptr);
        const store = allocator.create(Store) catch return error.OutOfMemory;
        errdefer allocator.destroy(store);
        store.* = .{
            .dir = dir,
            .path = path_copy,
            .threads = if (threads == 0) workers.cpuCount() else threads,
            .verify_reads = verify_reads,
            .durable = durable,
            .snapshots = undefined,
            .fell_back = false,
        };
        errdefer store.freeDictionary();
        // A new store has no superblock yet: looked for only when the read
        // finds none, so an open of an existing store makes no extra call.
        const snapshot = store.loadSnapshot(null) catch |err| retry: {
            if (err != error.NotAStore or missing == .refuse) return err;
            if (io.exists(store.dir, superblock_file.file_name)) return err;
            const staged = missing == .create_staged;
            try store.ensureSuperblock(staged);
            store.created_unsynced = staged;
            status.clear();
            break :retry try store.loadSnapshot(null);
        };
        store.snapshots = .init(snapshot);
        assert(store.head() == snapshot and store.writer == null);
        store.invariant();
        return store;
    }

    /// The (device, inode) of the directory this store opened.
    pub fn identity(store: *const Store) Error![2]u64 {
        return io.identity(store.dir);
    }

    /// Checkpoints the journal and, with durable=False, syncs first (a
    /// failure leaves the journal's records for the next open to replay and
    /// the last synced state in place: nothing durable is lost).
    pub fn close(store: *Store) void {
        store.invariant();
        if (store.writer) |*writer| {
            if (!writer.poisoned) {
                if (writer.journalPending(&store.head().superblock) or !store.durable) {
                    store.syncCommits() catch {};
                }
                // Checkpointed: the journal goes back to its page. A failure
                // leaves dead records, which the next writer cuts.
                if (writer.journal) |*handle| {
                    if (!writer.poisoned and !writer.journalPending(&store.head().superblock))
                        handle.trim() catch {};
                }
                if (!writer.poisoned and !writer.undo.active) writer.undo.trim(store.dir);
            }
        }
        if (store.writer) |*writer| writer.close();
        store.snapshots.deinit();
        store.freeDictionary();
        io.closeDir(store.dir);
        allocator.free(store.path);
        allocator.destroy(store);
    }

    fn freeDictionary(store: *Store) void {
        if (store.dictionary) |dictionary| {
            dictionary.deinit();
            allocator.destroy(dictionary);
            store.dictionary = null;
        }
        assert(store.dictionary == null);
    }

    /// What holds between calls: a path (open refuses an empty one), a
    /// reason that fits its buffer, a loaded dictionary's file named.
    fn invariant(store: *const Store) void {
        assert(store.path.len > 0);
        assert(store.fall_back_reason_len <= fall_back_reason_bytes_max);
        assert(store.dictionary == null or store.dictionary_file != 0);
    }

    /// Picks up commits made by other processes since open or the last refresh.
    pub fn refresh(store: *Store) Error!void {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        store.invariant();
        if (store.writer != null) return; // The writer's view is the latest.
        try store.refreshLocked();
    }

    /// Caller holds the mutex.
    pub fn refreshLocked(store: *Store) Error!void {
        const current = store.head();
        const next = try store.loadSnapshot(current);
        if (next != current) store.snapshots.publish(next);
        assert(store.head() == next);
    }

    fn openOrCreateDir(path: []const u8) Error!io.Dir {
        assert(path.len > 0);
        return io.openDir(path) catch |err| switch (err) {
            error.NotFound => {
                try io.makePath(path);
                return io.openDir(path);
            },
            else => return err,
        };
    }

    /// Creates the superblock of an empty store unless one exists. Refuses a
    /// directory that holds store files but no superblock: that store is damaged.
    fn ensureSuperblock(store: *Store, staged: bool) Error!void {
        assert(store.writer == null); // Only open creates a superblock.
        if (io.exists(store.dir, superblock_file.file_name)) return;
        var iterator = io.iterate(store.dir);
        while (try iterator.next()) |name| {
            if (format.parseFileName(name) != null) {
                return status.fail(
                    error.Corrupt,
                    "store '{s}' has data files but no superblock; it is damaged",
                    .{store.path},
                );
            }
        }
        try superblock_file.create(store.dir, !staged);
    }

    /// Reads the superblock and builds its snapshot, or returns `current` if
    /// nothing changed. A reader can race a writer that replaces files, so a
    /// missing file means "read the superblock again", a few times at most.
    fn loadSnapshot(store: *Store, current: ?*Snapshot) Error!*Snapshot {
        const attempts_max = 8;
        var attempt: u32 = 0;
        while (true) : (attempt += 1) {
            assert(attempt < attempts_max);
            const loaded = if (store.writer) |writer|
                try superblock_file.readFile(store.dir, writer.superblock)
            else
                try superblock_file.read(store.dir);
            var superblock = loaded.superblock;
            const unsynced_lost = superblock.unsynced != 0 and
                !try store.unsyncedSound(loaded, current);
            if (unsynced_lost) superblock = try store.syncedBase(loaded);
            store.judgeSlots(loaded, &superblock, unsynced_lost);
            // A slot that decodes, or its synced base: the other slot, sound.
            assert(superblock.invalidReason() == null);
            if (current) |snapshot| {
                if (snapshot.superblock.generation == superblock.generation) return snapshot;
            }
            // A data or sums file gone while settling: as for Snapshot.build.
            store.settleJournal(&superblock) catch |err| switch (err) {
                error.NotFound => if (attempt + 1 < attempts_max)
                    continue
                else
                    return store.missingFile(),
                else => return err,
            };
            const dictionary = store.loadDictionary(superblock) catch |err| switch (err) {
                error.NotFound => if (attempt + 1 < attempts_max)
                    continue
                else
                    return store.missingFile(),
                else => return err,
            };
            return Snapshot.build(
                store.dir,
                superblock,
                current,
                dictionary,
            ) catch |err| switch (err) {
                error.NotFound => if (attempt + 1 < attempts_max)
                    continue
                else
                    return store.missingFile(),
                else => return err,
            };
        }
    }

    /// Whether every byte an unsynced commit (durable=False) added since its
    /// synced base holds its checksum: after a power loss, some may never
    /// have reached the disk. Only what changed is read.
    fn unsyncedSound(
        store: *Store,
        loaded: superblock_file.Loaded,
        current: ?*Snapshot,
    ) Error!bool {
        const superblock = loaded.superblock;
        assert(superblock.unsynced != 0);
        const base = loaded.older orelse return false;
        if (base.generation != superblock.synced_base) return false;
        if (current) |snapshot| {
            if (snapshot.superblock.generation == superblock.generation) return true;
        }
        const dictionary = store.loadDictionary(superblock) catch return false;
        const snapshot = Snapshot.build(store.dir, superblock, null, dictionary) catch return false;
        defer snapshot.discard(null);
        return integrity.changedSound(snapshot, &base);
    }

    /// Sets `fell_back`, `damaged` and the reason for the superblock open
    /// takes (`opened`). A slot that does not decode is damage when it
    /// certainly held a superblock (`Unusable.Kind.damaged`), or when the
    /// lock file's page records a synced generation newer than `opened`
    /// (seqlock.recordSynced): a synced commit is never torn, since its
    /// slot is not written again until the other slot holds a newer synced
    /// one. Anything else is a commit a crash cut short (or an unsynced one
    /// a power loss took), which durability allows.
    fn judgeSlots(
        store: *Store,
        loaded: superblock_file.Loaded,
        opened: *const Superblock,
        unsynced_lost: bool,
    ) void {
        // Opened at the newest slot or, when its unsynced commit is lost,
        // at the older synced base it names.
        assert(opened.generation <= loaded.superblock.generation);
        store.fell_back = loaded.fell_back or unsynced_lost;
        defer assert(!store.damaged or store.fell_back);
        store.damaged = false;
        store.fall_back_reason_len = 0;
        const generation = opened.generation;
        const unusable = loaded.unusable orelse {
            if (unsynced_lost) store.setReason(
                "its last commit (generation {d}) was not synced and did not survive whole: it " ++
                    "opened at generation {d}, its last synced one",
                .{ loaded.superblock.generation, generation },
            );
            return;
        };
        if (unusable.kind == .damaged) {
            store.damaged = true;
            store.fell_back = true;
            return store.setReason(
                "superblock slot {d} is damaged ({s}) although it held a commit (the other slot " ++
                    "holds generation {d}); no crash leaves that: it opened at generation " ++
                    "{d}, and commits after it may be lost",
                .{ unusable.slot, unusable.reason, generation, generation },
            );
        }
        if (seqlock.syncedGeneration(store.dir)) |synced| {
            if (synced > generation and !store.committedSince(synced)) {
                store.damaged = true;
                store.fell_back = true;
                return store.setReason(
                    "generation {d} was committed and synced (the lock file records it), but " ++
                        "superblock slot {d} no longer holds it ({s}): it opened at " ++
                        "generation {d}, and the commits since are lost",
                    .{ synced, unusable.slot, unusable.reason, generation },
                );
            }
        }
        if (unusable.kind == .torn_or_damaged) {
            store.setReason(
                "superblock slot {d} does not decode ({s}): a commit cut short by a crash, or " ++
                    "damage to the older slot; it opened at generation {d}, the newest " ++
                    "sound one",
                .{ unusable.slot, unusable.reason, generation },
            );
        }
    }

    /// Whether the superblock now holds generation `synced` or a later one:
    /// a reader's read of the slots can overlap a writer's slot write (and
    /// see it half done) before the writer records the generation, so a
    /// record newer than what it read is damage only if the slots still
    /// do not hold it. Called on a path that has not failed.
    fn committedSince(store: *Store, synced: u64) bool {
        const again = superblock_file.read(store.dir) catch {
            status.clear();
            return false;
        };
        return again.superblock.generation >= synced;
    }

    fn setReason(store: *Store, comptime text: []const u8, args: anytype) void {
        const written = std.fmt.bufPrint(
            &store.fall_back_reason,
            text,
            args,
        ) catch store.fall_back_reason[0..];
        store.fall_back_reason_len = written.len;
        assert(store.fall_back_reason_len <= fall_back_reason_bytes_max);
    }

    /// Why open fell back or found damage; empty when it did neither.
    pub fn fallBackReason(store: *const Store) []const u8 {
        assert(store.fall_back_reason_len <= fall_back_reason_bytes_max);
        return store.fall_back_reason[0..store.fall_back_reason_len];
    }

    /// Fails when the superblock is damaged (`judgeSlots`), saying so.
    pub fn refuseDamaged(store: *const Store, comptime action: []const u8) Error!void {
        store.invariant();
        if (!store.damaged) return;
        return status.fail(
            error.Corrupt,
            "store '{s}' is damaged: {s}. " ++ action ++ "; restore the store from a copy (what " ++
                "it holds now can still be read)",
            .{ store.path, store.fallBackReason() },
        );
    }

    /// The synced base an unsynced head names, which open falls back to.
    fn syncedBase(store: *Store, loaded: superblock_file.Loaded) Error!Superblock {
        assert(loaded.superblock.unsynced != 0);
        const base = loaded.older orelse return status.fail(
            error.Corrupt,
            "store '{s}' is damaged: its last commit was not synced and its synced base is gone",
            .{store.path},
        );
        if (base.generation != loaded.superblock.synced_base) {
            return status.fail(
                error.Corrupt,
                "store '{s}' is damaged: its last commit was not synced and the other slot is " ++
                    "not its synced base",
                .{store.path},
            );
        }
        // A sound unsynced superblock names an older base (format.zig).
        assert(base.generation < loaded.superblock.generation);
        return base;
    }

    /// A reader that finds no live writer settles the journal a killed
    /// writer left (journal.settleReader). A live writer applied it already
    /// (its begin replays).
    fn settleJournal(store: *Store, superblock: *const Superblock) Error!void {
        if (superblock.getLayout() != .fixed or store.writer != null) return;
        assert(superblock.invalidReason() == null); // As read, not yet built.
        // Unsynced in-place replaces go back to the last sync first.
        try undo.settleReader(store.dir, superblock);
        return journal.settleReader(store.dir, superblock);
    }

    /// The slow path of a reader's wait on the sequence lock
    /// (journal.waitEven): settles what a writer killed mid-replace left,
    /// once its lock is free. Returns whether the lock is even now; if not,
    /// waits a millisecond (holding the mutex, so no commit of this handle
    /// starts meanwhile).
    pub fn settleStuck(store: *Store, page: *const format.JournalPage) Error!bool {
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        const on_disk = try superblock_file.read(store.dir);
        try store.settleJournal(&on_disk.superblock);
        if (seqlock.readBegin(page) % 2 == 0) return true;
        std.Thread.sleep(std.time.ns_per_ms);
        return false;
    }

    /// Runs the read `function(args)` until no in-place replace overlapped
    /// it, so it sees one committed state whole; its failure counts only
    /// then (a checksum read mid-replace is no damage).
    fn consistentRead(
        store: *Store,
        snapshot: *const Snapshot,
        comptime function: anytype,
        args: anytype,
    ) Error!void {
        const page = snapshot.journalPage() orelse return @call(.auto, function, args);
        const attempts_max = 100_000;
        for (0..attempts_max) |_| {
            const before = try journal.waitEven(store.dir, page, store);
            const outcome = @call(.auto, function, args);
            if (seqlock.readBegin(page) == before) return outcome;
        }
        return status.fail(
            error.Io,
            "store '{s}': a read raced in-place replaces {d} times in a row",
            .{ store.path, attempts_max },
        );
    }

    fn missingFile(store: *Store) Error {
        return status.wrap(error.Corrupt, "store '{s}' is damaged", .{store.path});
    }

    /// The dictionary `superblock` names, loaded once and checked against
    /// its checksum; null if it names none.
    pub fn loadDictionary(store: *Store, superblock: Superblock) Error!?*const codec.Dictionary {
        if (superblock.dict_file == 0) return null;
        if (store.dictionary) |dictionary| {
            if (store.dictionary_file == superblock.dict_file) return dictionary;
            return status.fail(
                error.Corrupt,
                "store '{s}' names a different dictionary than the one loaded",
                .{store.path},
            );
        }
        var name_buffer: [format.file_name_bytes]u8 = undefined;
        const file = try io.openFile(
            store.dir,
            format.fileName(&name_buffer, .dict, superblock.dict_file),
            .read_only,
        );
        defer io.closeFile(file);
        const bytes = allocator.alloc(u8, superblock.dict_bytes) catch return error.OutOfMemory;
        defer allocator.free(bytes);
        const got = try io.read(file, bytes, 0);
        if (got != bytes.len or format.hash(0, bytes) != superblock.dict_checksum) {
            return status.fail(
                error.Corrupt,
                "store '{s}' is damaged: dictionary '{s}' fails its checksum",
                .{ store.path, file.name() },
            );
        }
        const dictionary = allocator.create(codec.Dictionary) catch return error.OutOfMemory;
        errdefer allocator.destroy(dictionary);
        dictionary.* = try codec.Dictionary.init(bytes);
        store.dictionary = dictionary;
        store.dictionary_file = superblock.dict_file;
        assert(store.dictionary_file != 0);
        return dictionary;
    }

    pub fn head(store: *Store) *Snapshot {
        return store.snapshots.head();
    }

    // ---- the writer and its commits: the one place the state changes ------

    /// What the commit protocol and the layouts see of this store.
    fn commitContext(store: *Store) commit.Context {
        assert(store.writer != null);
        return .{
            .dir = store.dir,
            .path = store.path,
            .durable = store.durable,
            .threads = store.threads,
            .writer = &store.writer.?,
            .head = store.head(),
        };
    }

    /// Takes the writer lock on first use, then discards what a crashed
    /// writer left past the committed state and replays its journal.
    fn begin(store: *Store) Error!void {
        try store.refuseDamaged(writes_refused);
        if (store.writer) |*writer| {
            try commit.refusePoisoned(writer, store.path);
            if (writer.stale) {
                try commit.recover(store.commitContext());
                // Recovery keeps what the last synced state names until a sync.
                writer.stale = store.head().superblock.unsynced != 0;
            }
            return;
        }
        // Set before the refresh, which then reads through the writer's
        // superblock file.
        store.writer = try commit.open(store.dir, store.path);
        errdefer {
            store.writer.?.close();
            store.writer = null;
        }
        try store.refreshLocked();
        try store.refuseDamaged(writes_refused);
        try commit.start(&store.writer.?, store.head().superblock);
        try commit.recover(store.commitContext());
        // Files the last synced state names wait for the next sync.
        store.writer.?.stale = store.head().superblock.unsynced != 0;
        try store.restoreUndo();
        try store.replayJournal();
        assert(store.writer != null and !store.writer.?.poisoned);
        assert(!store.damaged);
    }

    const writes_refused = "Writes are refused: a writer's recovery would cut what the lost " ++
        "commits wrote";

    /// Restores the synced images a writer that stopped mid-interval left
    /// in the undo area (undo.zig), then commits a new generation, which
    /// makes them dead: the store is at its last sync.
    fn restoreUndo(store: *Store) Error!void {
        const superblock = store.head().superblock;
        if (superblock.getLayout() == .fixed and try undo.pending(store.dir, &superblock)) {
            const writer = &store.writer.?;
            const target = try writer.target.get(store.dir, &superblock);
            if (try undo.restore(store.dir, target, &superblock, writer.page))
                try store.commitNext(superblock, true);
        }
        // Dead records (the commit above, or a writer's last) go.
        try undo.removeStale(store.dir, &store.head().superblock);
    }

    /// Replays the journal records a crashed writer left after the
    /// checkpoint (journal.settle) and checkpoints them, so this writer
    /// starts from a superblock that covers every committed replace.
    fn replayJournal(store: *Store) Error!void {
        const superblock = store.head().superblock;
        if (superblock.journal_file == 0) return;
        const writer = &store.writer.?;
        // Held by the writer at once: begin's errdefer closes it.
        assert(writer.journal == null and superblock.getLayout() == .fixed);
        writer.journal = try journal.open(store.dir, &superblock, writer.page);
        const replayed = try journal.settle(store.dir, &writer.journal.?, &superblock);
        if (replayed.records > 0) {
            store.head().superblock.tail_checksum = replayed.tail_checksum;
            var next = superblock;
            next.tail_checksum = replayed.tail_checksum;
            try store.commitNext(next, store.durable);
        }
        // A new writer starts from a journal cut back to its page.
        writer.journal.?.restart();
        try writer.journal.?.trim();
        assert(!writer.journalPending(&store.head().superblock));
    }

    /// Commits what a layout wrote and publishes it, then deletes the files
    /// it replaced.
    fn publish(store: *Store, next: commit.Next) Error!void {
        assert(store.writer != null);
        assert(next.superblock.generation == store.head().superblock.generation);
        if (next.data_synced) store.writer.?.journal_synced = true;
        try store.commitNext(next.superblock, store.durable);
        if (next.created and store.durable) store.created_unsynced = false;
        if (next.replaced) |old| commit.unlinkReplaced(store.commitContext(), old);
    }

    /// Makes `next` the store's next generation (commit.zig: seal, map,
    /// write and sync its slot) and publishes it to readers.
    fn commitNext(store: *Store, next: Superblock, durable: bool) Error!void {
        const generation = store.head().superblock.generation;
        const pending = try commit.prepare(store.commitContext(), next, durable);
        const dictionary = try store.loadDictionary(pending.superblock);
        const snapshot = try commit.write(store.commitContext(), pending, dictionary);
        store.fell_back = false;
        store.fall_back_reason_len = 0;
        store.snapshots.publish(snapshot);
        commit.finish(store.commitContext(), pending);
        assert(store.head().superblock.generation == generation + 1);
    }

    /// Makes every commit so far durable (durable=False stores), then
    /// deletes the files that commits since the last sync replaced.
    fn syncCommits(store: *Store) Error!void {
        const writer = &store.writer.?;
        const head_now = store.head();
        if (head_now.superblock.unsynced != 0 or writer.journalPending(&head_now.superblock)) {
            try store.commitNext(head_now.superblock, true);
        } else if (!writer.stale) return;
        try commit.recover(store.commitContext());
        writer.stale = false;
        assert(store.head().superblock.unsynced == 0);
        assert(!writer.journalPending(&store.head().superblock));
    }

    /// An in-place replace of rows of the fixed layout, journaled
    /// (journal.zig); the commits around it are published here.
    fn replaceInPlace(
        store: *Store,
        indices: []const u64,
        ascending: bool,
        source: []const u8,
        offsets: []const u64,
    ) Error!void {
        assert(store.head().layout() == .fixed and indices.len == offsets.len);
        const stride = store.head().superblock.record_bytes;
        // Records of zero bytes: every replace leaves them as they are.
        if (stride == 0) return;
        const patches = try journal.patchesOf(indices, ascending, source, offsets, stride);
        defer allocator.free(patches);
        assert(patches.len == indices.len);
        // A store opened with durable=False syncs before its first in-place
        // replace after unsynced commits: a journal record is always based
        // on a synced generation, so a power loss can never leave replaced
        // bytes in files whose superblock is gone.
        if (store.head().superblock.unsynced != 0) try store.syncCommits();
        if (store.head().superblock.journal_file == 0) {
            const next = try journal.withNewJournal(store.dir, store.head().superblock);
            try commit.syncDirNow(store.commitContext());
            try store.commitNext(next, true);
        }
        const writer = &store.writer.?;
        // Null only when opening it failed right after the commit that named it.
        if (writer.journal == null) {
            writer.journal = try journal.open(store.dir, &store.head().superblock, writer.page);
        }
        // A journal past its bound is checkpointed before it takes another
        // record, not right after the record that grew it: the replace that
        // wrote a large record returns without waiting for the data file's
        // write-back, and the checkpoint finds most of it written.
        if (writer.journal.?.end > journal.checkpoint_bytes) {
            try store.commitNext(store.head().superblock, store.durable);
        }
        const base = store.head();
        const target = try writer.target.get(store.dir, &base.superblock);
        if (!store.durable) {
            // No barrier per replace: each block's synced image goes to the
            // undo area once per sync interval (undo.zig).
            base.superblock.tail_checksum = try undo.replace(
                &writer.undo,
                store.dir,
                target,
                &base.superblock,
                patches,
                base,
                writer.page,
                store.threads,
                &writer.poisoned,
            );
            assert(writer.journalPending(&base.superblock) and base == store.head());
            return;
        }
        const tail = try journal.replace(
            &writer.journal.?,
            target,
            &base.superblock,
            patches,
            base,
            store.threads,
            &writer.poisoned,
        );
        // The in-place state is published in the head's superblock and in
        // the shared page (journal.replace), not as a new generation.
        base.superblock.tail_checksum = tail;
        assert(writer.journalPending(&base.superblock) and base == store.head());
    }

    // ---- reads ----------------------------------------------------------
    pub fn count(store: *Store) u64 {
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        assert(store.snapshots.in_flight.load(.seq_cst) > 0);
        return snapshot.count();
    }

    pub fn info(store: *Store) Info {
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        const superblock = snapshot.superblock;
        assert(superblock.live_bytes <= superblock.data_bytes); // format.zig checks it.
        return .{
            .records = superblock.record_count,
            .live_bytes = superblock.live_bytes,
            .chunk_bytes = superblock.data_bytes,
            .reclaimable = superblock.data_bytes - superblock.live_bytes,
            .record_bytes = superblock.record_bytes,
            .generation = superblock.generation,
            .layout = superblock.layout,
            .has_dict = @intFromBool(superblock.dict_file != 0),
            .fell_back = @intFromBool(store.fell_back),
            .damaged = @intFromBool(store.damaged),
            .data_file = superblock.data_file,
        };
    }

    pub fn lengths(store: *Store, indices: []const u64, out: []u64) Error!void {
        status.clear();
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        assert(store.snapshots.in_flight.load(.seq_cst) > 0);
        if (!store.verify_reads) return read.lengths(snapshot, false, indices, out);
        return store.consistentRead(snapshot, read.lengths, .{ snapshot, true, indices, out });
    }

    /// The records of a fixed store (record i at `i * record_bytes`) whose
    /// bytes in `edited` (records 0.. as many as it holds) differ from the
    /// committed ones, among those overlapping `pages` (ascending page
    /// numbers of `page_bytes`), into `out`; returns how many
    /// (changes.checkedChangedRows). It compares through the store's own mapping,
    /// so a replace of them that follows finds the blocks it checks mapped.
    pub fn changedRows(
        store: *Store,
        edited: []const u8,
        pages: []const u64,
        page_bytes: u64,
        out: []u64,
    ) Error!usize {
        status.clear();
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        const stride = snapshot.superblock.record_bytes;
        const data = snapshot.dataBytes();
        if (snapshot.layout() != .fixed or stride == 0 or edited.len % stride != 0 or
            edited.len > data.len)
        {
            return status.fail(
                error.InvalidArgument,
                "store '{s}' does not hold {d} bytes of fixed-size records to compare with " ++
                    "(its layout: {s}, {d} data bytes)",
                .{ store.path, edited.len, @tagName(snapshot.layout()), data.len },
            );
        }
        const committed = data[0..edited.len];
        return changes.checkedChangedRows(edited, committed, stride, pages, page_bytes, out);
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
        // Bounded: each retry follows a commit made meanwhile.
        for (0..stale_retries_max) |_| {
            var generation: u64 = undefined;
            const outcome = store.gatherOnce(indices, target, target_offsets, &generation);
            if (outcome != error.ChecksumMismatch) return outcome;
            if (!try store.refreshIfStale(generation)) return outcome;
        }
        var generation: u64 = undefined;
        return store.gatherOnce(indices, target, target_offsets, &generation);
    }

    const stale_retries_max = 4;

    fn gatherOnce(
        store: *Store,
        indices: []const u64,
        target: []u8,
        target_offsets: ?[]const u64,
        generation: *u64,
    ) Error!void {
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        assert(store.snapshots.in_flight.load(.seq_cst) > 0);
        generation.* = snapshot.superblock.generation;
        return store.consistentRead(
            snapshot,
            read.gather,
            .{
                snapshot,
                store.threads,
                store.checksReads(snapshot),
                indices,
                target,
                target_offsets,
            },
        );
    }

    /// Whether reads of `snapshot` check record checksums.
    pub fn checksReads(store: *const Store, snapshot: *const Snapshot) bool {
        return store.verify_reads or (store.verify_indexed_reads and snapshot.layout() == .indexed);
    }

    /// A reader whose snapshot predates a commit checks the partial last
    /// block against the checksum its superblock had, which an in-place
    /// replace since may have changed: a mismatch there is no damage until
    /// the newest superblock says so too. Refreshes such a reader; returns
    /// whether it did.
    fn refreshIfStale(store: *Store, generation: u64) Error!bool {
        if (store.writer != null) return false;
        // Another thread refreshed.
        if (store.head().superblock.generation != generation) return true;
        const on_disk = superblock_file.read(store.dir) catch return false;
        if (on_disk.superblock.generation == generation) return false;
        try store.refresh();
        return store.head().superblock.generation != generation;
    }

    /// Appends to `out` the indices in [start, end) whose bytes fail their
    /// checksum (or whose entry is unusable). Returns how many it found.
    pub fn verify(store: *Store, start: u64, end: u64, out: []u64) Error!u64 {
        status.clear();
        for (0..stale_retries_max) |_| {
            var generation: u64 = undefined;
            const found = try store.verifyOnce(start, end, out, &generation);
            if (found == 0 or !try store.refreshIfStale(generation)) return found;
        }
        var generation: u64 = undefined;
        return store.verifyOnce(start, end, out, &generation);
    }

    fn verifyOnce(store: *Store, start: u64, end: u64, out: []u64, generation: *u64) Error!u64 {
        try store.refuseDamaged("Its records were not checked");
        const snapshot = store.snapshots.acquire();
        defer store.snapshots.release();
        generation.* = snapshot.superblock.generation;
        if (start > end or end > snapshot.count()) {
            return status.fail(
                error.IndexOutOfRange,
                "verify range [{d}, {d}) is outside a store of {d} records",
                .{ start, end, snapshot.count() },
            );
        }
        assert(out.len >= end - start);
        var found: u64 = 0;
        try store.consistentRead(snapshot, findDamaged, .{ snapshot, start, end, out, &found });
        return found;
    }

    // ---- writes ---------------------------------------------------------

    /// Appends the records packed in `source` (record k starts at
    /// `offsets[k]`, the last runs to the end). Returns the first new index.
    pub fn append(
        store: *Store,
        source: []const u8,
        offsets: []const u64,
        record_codec: Codec,
    ) Error!u64 {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        const length = try encode.checkBatch(source, offsets);
        try store.begin();
        return store.appendBegun(source, offsets, record_codec, length) catch |err| {
            commit.discardFailed(store.commitContext(), err);
            return err;
        };
    }

    fn appendBegun(
        store: *Store,
        source: []const u8,
        offsets: []const u64,
        record_codec: Codec,
        length: ?u64,
    ) Error!u64 {
        const current = store.head();
        assert(offsets.len > 0); // encode.checkBatch refused an empty batch.
        const first = current.count();
        if (first + offsets.len > format.record_count_max) {
            return status.fail(
                error.TooLarge,
                "a store holds at most {d} records",
                .{format.record_count_max},
            );
        }
        try checkCodec(current, record_codec);
        const superblock = current.superblock;
        const fits_fixed = record_codec == .raw and length != null and
            switch (superblock.getLayout()) {
                .empty => true,
                .fixed => length.? == superblock.record_bytes,
                .indexed => false,
            };
        if (fits_fixed) {
            const payload = source[offsets[0]..];
            try store.publish(
                try fixed.append(store.commitContext(), payload, offsets.len, length.?),
            );
        } else {
            if (superblock.getLayout() == .fixed) {
                try store.publish(try fixed.convertToIndexed(store.commitContext()));
            }
            try store.publish(
                try indexed.append(store.commitContext(), source, offsets, record_codec),
            );
        }
        assert(store.head().count() == first + offsets.len);
        return first;
    }

    /// Gives records `indices` new contents, packed like `append`'s.
    pub fn replace(
        store: *Store,
        indices: []const u64,
        source: []const u8,
        offsets: []const u64,
        record_codec: Codec,
    ) Error!void {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        if (indices.len != offsets.len) {
            return status.fail(
                error.InvalidArgument,
                "replace got {d} indices but {d} records",
                .{ indices.len, offsets.len },
            );
        }
        const length = try encode.checkBatch(source, offsets);
        try store.begin();
        const current = store.head();
        try read.checkIndices(current, indices);
        try checkCodec(current, record_codec);
        assert(indices.len == offsets.len);
        // Ascending indices (a slice, a sorted list) repeat none: no copy.
        const ascending = strictlyAscending(indices);
        if (!ascending) {
            const sorted = try sortedCopy(indices);
            defer allocator.free(sorted);
            for (sorted[1..], sorted[0 .. sorted.len - 1]) |next, previous| {
                if (next == previous) {
                    return status.fail(
                        error.InvalidArgument,
                        "index {d} appears twice; replace each record at most once per call",
                        .{next},
                    );
                }
            }
        }
        const superblock = current.superblock;
        const fits_fixed = superblock.getLayout() == .fixed and record_codec == .raw and
            length != null and length.? == superblock.record_bytes;
        if (fits_fixed) {
            try store.replaceInPlace(indices, ascending, source, offsets);
        } else {
            if (superblock.getLayout() == .fixed) {
                try store.publish(try fixed.convertToIndexed(store.commitContext()));
            }
            const context = store.commitContext();
            try store.publish(try indexed.replace(context, indices, source, offsets, record_codec));
        }
    }

    /// Deletes records `indices` (repeats allowed). With `keep_order` the
    /// survivors keep their order; otherwise the tail fills each hole: the
    /// surviving records past the new end move, in ascending order, into the
    /// holes below it, in ascending order (repeated swap-remove).
    pub fn delete(store: *Store, indices: []const u64, keep_order: bool) Error!void {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        try store.begin();
        const current = store.head();
        try read.checkIndices(current, indices);
        if (indices.len == 0) return status.fail(
            error.InvalidArgument,
            "delete got no indices",
            .{},
        );
        const doomed = try sortedCopy(indices);
        defer allocator.free(doomed);
        const unique = dedupe(doomed);
        assert(unique.len >= 1 and unique.len <= current.count());
        const plan = plans.DeletePlan.init(current, unique, keep_order);
        switch (current.layout()) {
            .fixed => try store.publish(
                try fixed.rewrite(store.commitContext(), plan.remaining, &plan),
            ),
            .indexed => {
                const live = current.superblock.live_bytes - deletedBytes(current, unique);
                try store.publish(
                    try indexed.rewrite(store.commitContext(), plan.remaining, &plan, live),
                );
            },
            .empty => unreachable, // checkIndices refused every index.
        }
        assert(store.head().count() == plan.remaining);
    }

    /// Rewrites the live records of an indexed store into new files, dropping
    /// the bytes of deleted and replaced records.
    pub fn compact(store: *Store) Error!void {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        try store.begin();
        const current = store.head();
        if (current.layout() != .indexed) return;
        if (current.superblock.live_bytes == current.superblock.data_bytes) return;
        assert(current.superblock.live_bytes < current.superblock.data_bytes);
        try store.publish(try indexed.compact(store.commitContext()));
        assert(store.head().superblock.live_bytes == store.head().superblock.data_bytes);
    }

    /// Makes every commit so far durable. With durable=True they are when
    /// they return (a replace's journal record too), so this only reports a
    /// writer that can no longer promise it; with durable=False it syncs.
    pub fn sync(store: *Store) Error!void {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        if (store.writer) |writer| {
            if (writer.poisoned) return store.begin();
        }
        if (store.created_unsynced) {
            try superblock_file.syncCreated(store.dir);
            store.created_unsynced = false;
        }
        if (store.durable) return;
        // Commits an earlier durable=False writer left unsynced are synced
        // too: this handle becomes the writer for that.
        if (store.writer == null and store.head().superblock.unsynced == 0) return;
        try store.begin();
        try store.syncCommits();
        assert(store.head().superblock.unsynced == 0);
    }

    pub fn trainDict(
        store: *Store,
        samples: []const u8,
        sizes: []const u64,
        target_bytes: u64,
    ) Error!u64 {
        status.clear();
        store.snapshots.mutex.lock();
        defer store.snapshots.mutex.unlock();
        try store.begin();
        const current = store.head();
        if (current.superblock.dict_file != 0) {
            return status.fail(
                error.DictionaryExists,
                "store '{s}' already has a dictionary; records compressed with it need it, so " ++
                    "it cannot be replaced",
                .{store.path},
            );
        }
        if (target_bytes < format.dict_bytes_min or target_bytes > format.dict_bytes_max) {
            return status.fail(
                error.InvalidArgument,
                "dictionary size must be {d} B to {d} B, got {d}",
                .{ format.dict_bytes_min, format.dict_bytes_max, target_bytes },
            );
        }
        var total: u64 = 0;
        for (sizes) |size| total = std.math.add(u64, total, size) catch std.math.maxInt(u64);
        if (total != samples.len or sizes.len == 0 or sizes.len > std.math.maxInt(c_uint)) {
            return status.fail(
                error.InvalidArgument,
                "train_dict: sample sizes sum to {d} but the samples hold {d} bytes",
                .{ total, samples.len },
            );
        }
        const buffer = allocator.alloc(u8, target_bytes) catch return error.OutOfMemory;
        defer allocator.free(buffer);
        const trained = clib.ZDICT_trainFromBuffer(
            buffer.ptr,
            buffer.len,
            samples.ptr,
            sizes.ptr,
            @intCast(sizes.len),
        );
        if (clib.ZDICT_isError(trained) != 0) {
            return status.fail(
                error.Codec,
                "dictionary training failed ({s}); give more and more varied samples (zstd " ++
                    "wants about 100x the dictionary size)",
                .{clib.ZSTD_getErrorName(trained)},
            );
        }
        const bytes = buffer[0..trained];
        var next = current.superblock;
        next.dict_file = next.generation + 1;
        next.dict_bytes = bytes.len;
        next.dict_checksum = format.hash(0, bytes);
        const context = store.commitContext();
        const file = try commit.createFile(context, .dict, next.dict_file);
        defer io.closeFile(file);
        try io.write(file, bytes, 0);
        try commit.syncFile(context, file);
        try commit.syncDir(context);
        try store.commitNext(next, store.durable);
        assert(store.head().superblock.dict_file == next.dict_file);
        return bytes.len;
    }
};

fn findDamaged(
    snapshot: *const Snapshot,
    start: u64,
    end: u64,
    out: []u64,
    found: *u64,
) Error!void {
    found.* = integrity.unsoundRecords(snapshot, start, end, out);
}

// ---- batch helpers -------------------------------------------------------------

fn checkCodec(snapshot: *const Snapshot, record_codec: Codec) Error!void {
    if (record_codec.usesDictionary() and snapshot.dictionary == null) {
        return status.fail(
            error.NoDictionary,
            "codec '{s}' needs a trained dictionary: call train_dict(samples, sizes, target) first",
            .{@tagName(record_codec)},
        );
    }
    assert(!record_codec.usesDictionary() or snapshot.dictionary != null);
}

fn strictlyAscending(indices: []const u64) bool {
    if (indices.len < 2) return true;
    // No early exit: one pass the compiler vectorises.
    var descents: u64 = 0;
    for (indices[1..], indices[0 .. indices.len - 1]) |next, previous| {
        descents |= @intFromBool(next <= previous);
    }
    return descents == 0;
}

fn sortedCopy(indices: []const u64) Error![]u64 {
    const copy = allocator.dupe(u64, indices) catch return error.OutOfMemory;
    std.mem.sort(u64, copy, {}, std.sort.asc(u64));
    assert(copy.len == indices.len);
    assert(std.sort.isSorted(u64, copy, {}, std.sort.asc(u64)));
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
    assert(strictlyAscending(sorted[0..kept]));
    return sorted[0..kept];
}

fn deletedBytes(snapshot: *const Snapshot, doomed: []const u64) u64 {
    var total: u64 = 0;
    const entries = snapshot.entries();
    assert(snapshot.layout() == .indexed and entries.len == snapshot.count());
    for (doomed) |index| total += entries[index].storedBytes();
    return @min(total, snapshot.superblock.live_bytes);
}

// ---- tests -----------------------------------------------------------------------

const testing = std.testing;

// Tests run on the simulated disk of testing/storage.zig (see io.zig).
const simulated = @import("testing/storage.zig");

test "append, gather and reopen round trip in both layouts" {
    simulated.reset();
    const path = "roundtrip";

    const store = try Store.open(path, 2, true, true);
    const source = "aaaabbbbcccc";
    const offsets = [_]u64{ 0, 4, 8 };
    try testing.expectEqual(@as(u64, 0), try store.append(source, &offsets, .raw));
    try testing.expectEqual(Layout.fixed, store.head().layout());
    // A record of another length turns the store indexed, keeping the old ones.
    try testing.expectEqual(@as(u64, 3), try store.append("dd", &.{0}, .zstd));
    try testing.expectEqual(Layout.indexed, store.head().layout());
    store.close();

    const reopened = try Store.open(path, 2, true, true);
    defer reopened.close();
    var target: [14]u8 = undefined;
    const indices = [_]u64{ 3, 0, 2, 1 };
    const target_offsets = [_]u64{ 0, 2, 6, 10 };
    try reopened.gather(&indices, &target, &target_offsets);
    try testing.expectEqualStrings("ddaaaaccccbbbb", &target);
}

test "a failed append gives its bytes back at once: every file is cut to what is committed" {
    // ENOSPC at each write of an append that grows an indexed store: the
    // data file must not keep the bytes written before the failure until
    // some later write. (A failed superblock write poisons the writer: the
    // reopening writer cuts them.)
    var cut_at_once: u64 = 0;
    for (0..12) |at| {
        simulated.reset();
        var store = try Store.open("full", 1, true, true);
        defer store.close();
        _ = try store.append("abcdabcd", &.{ 0, 4 }, .raw);
        _ = try store.append("xyz", &.{0}, .zstd);
        const committed = store.head().superblock;
        var big: [20000]u8 = undefined;
        var prng = std.Random.DefaultPrng.init(at);
        prng.random().bytes(&big);
        simulated.injectFault(.write, simulated.kindCount(.write) + at, .enospc);
        const outcome = store.append(&big, &.{ 0, 9000 }, .zstd);
        if (!simulated.clearFault()) {
            _ = try outcome;
            continue;
        }
        try testing.expectError(error.NoSpace, outcome);
        try testing.expect(std.mem.indexOf(u8, status.message(), "NoSpaceLeft") != null);
        try testing.expectEqual(committed.generation, store.head().superblock.generation);
        if (store.writer.?.poisoned) {
            store.close();
            store = try Store.open("full", 1, true, true);
            try store.compact(); // any write recovers first
        } else cut_at_once += 1;
        try expectCommittedFilesOnly("full", committed);
        // The store still takes the append once the disk has room.
        _ = try store.append(&big, &.{ 0, 9000 }, .zstd);
        try testing.expectEqual(@as(u64, 5), store.count());
    }
    try testing.expect(cut_at_once >= 2);
}

/// The store at `path` holds only the files `committed` names, each of its
/// committed length (the journal aside: it keeps its page).
fn expectCommittedFilesOnly(path: []const u8, committed: Superblock) !void {
    var names: std.ArrayList([]const u8) = .empty;
    defer names.deinit(testing.allocator);
    try simulated.listNames(path, &names, testing.allocator);
    const dir = try io.openDir(path);
    defer io.closeDir(dir);
    for (names.items) |name| {
        const parsed = format.parseFileName(name) orelse continue;
        const file = try io.openFile(dir, name, .read_only);
        defer io.closeFile(file);
        const bytes = try io.length(file);
        switch (parsed.kind) {
            .data => try testing.expectEqual(committed.data_bytes, bytes),
            .index => try testing.expectEqual(
                committed.record_count * @sizeOf(format.Entry),
                bytes,
            ),
            else => {},
        }
        try testing.expectEqual(parsed.id, switch (parsed.kind) {
            .data => committed.data_file,
            .index => committed.index_file,
            .sums => committed.sums_file,
            .dict => committed.dict_file,
            .journal => committed.journal_file,
        });
    }
}

/// Rewrites byte `at` of the superblock file of the store at `path`.
fn patchSuperblock(path: []const u8, at: u64, value: ?u8, zero_slot: ?u1) !void {
    const dir = try io.openDir(path);
    defer io.closeDir(dir);
    const file = try io.openFile(dir, superblock_file.file_name, .read_write);
    defer io.closeFile(file);
    if (zero_slot) |slot| try io.write(
        file,
        &([_]u8{0} ** format.slot_bytes),
        @as(u64, slot) * format.slot_bytes,
    );
    if (value) |byte| {
        var old: [1]u8 = undefined;
        _ = try io.read(file, &old, at);
        try io.write(file, &.{old[0] ^ byte}, at);
    }
}

/// One damage case for the test below: which superblock bytes a crash or a
/// bad disk changed, and what the next open must make of it.
const DamageCase = struct {
    zero: ?u1,
    flip_newest: bool,
    flip_older: bool,
    forget_synced: bool,
    generation: u64,
    damaged: bool,
};

/// Writes three durable appends (generation 3 in slot 1, generation 2 in slot
/// 0), damages them as `case` says, and checks what the reopened store makes of it.
fn expectDamageJudged(case: DamageCase) !void {
    const path = "judged";
    simulated.reset();
    const writer = try Store.open(path, 1, true, true);
    for (0..3) |_| _ = try writer.append("abcd", &.{0}, .raw);
    writer.close();
    if (case.zero) |slot| try patchSuperblock(path, 0, null, slot);
    if (case.flip_newest) try patchSuperblock(path, format.slot_bytes + 40, 0x04, null);
    if (case.flip_older) try patchSuperblock(path, 40, 0x04, null);
    if (case.forget_synced) {
        const dir = try io.openDir(path);
        defer io.closeDir(dir);
        const lock = try io.openFile(dir, seqlock.lock_file_name, .read_write);
        defer io.closeFile(lock);
        try io.write(
            lock,
            &([_]u8{0} ** 16),
            @offsetOf(format.JournalPage, "synced_generation"),
        );
    }
    const store = try Store.open(path, 1, true, true);
    defer store.close();
    const info = store.info();
    try testing.expectEqual(case.generation, info.generation);
    try testing.expectEqual(@as(u32, 1), info.fell_back);
    try testing.expectEqual(@intFromBool(case.damaged), info.damaged);
    try testing.expect(store.fallBackReason().len > 0);
    var damaged: [3]u64 = undefined;
    if (case.damaged) {
        try testing.expectError(error.Corrupt, store.verify(0, store.count(), &damaged));
        try testing.expectError(error.Corrupt, store.append("efgh", &.{0}, .raw));
    } else {
        try testing.expectEqual(@as(u64, 0), try store.verify(0, store.count(), &damaged));
        _ = try store.append("efgh", &.{0}, .raw);
        try testing.expectEqual(@as(u32, 0), store.info().fell_back);
    }
}

test "a slot that lost its magic after a commit, or a lost synced generation, is damage" {
    const cases = [_]DamageCase{
        .{
            .zero = 1,
            .flip_newest = false,
            .flip_older = false,
            .forget_synced = false,
            .generation = 2,
            .damaged = true,
        },
        .{
            .zero = 0,
            .flip_newest = false,
            .flip_older = false,
            .forget_synced = false,
            .generation = 3,
            .damaged = true,
        },
        .{
            .zero = null,
            .flip_newest = true,
            .flip_older = false,
            .forget_synced = false,
            .generation = 2,
            .damaged = true,
        },
        .{
            .zero = null,
            .flip_newest = true,
            .flip_older = false,
            .forget_synced = true,
            .generation = 2,
            .damaged = false,
        },
        .{
            .zero = null,
            .flip_newest = false,
            .flip_older = true,
            .forget_synced = false,
            .generation = 3,
            .damaged = false,
        },
    };
    for (cases) |case| try expectDamageJudged(case);
}

test "an open that refuses a missing store creates nothing" {
    simulated.reset();
    try testing.expectError(error.NotFound, Store.openWith("missing", 1, false, true, .refuse));
    try testing.expectError(error.NotFound, io.openDir("missing"));
    try io.makePath("empty");
    try testing.expectError(error.NotAStore, Store.openWith("empty", 1, false, true, .refuse));
    const dir = try io.openDir("empty");
    defer io.closeDir(dir);
    try testing.expect(!io.exists(dir, superblock_file.file_name));
    const created = try Store.openWith("empty", 1, false, true, .create);
    created.close();
    const reopened = try Store.openWith("empty", 1, false, true, .refuse);
    reopened.close();
}

test "an open beside a side file reads it through the store's directory handle" {
    simulated.reset();
    const path = "beside";
    var buffer: [8]u8 = undefined;
    // No side file: nothing opened (the testing allocator finds any leak).
    const created = try Store.open(path, 1, false, true);
    _ = try created.append("abcd", &.{0}, .raw);
    created.close();
    try testing.expect(try Store.openBeside(path, 1, false, true, "side", &buffer) == null);
    try testing.expectError(
        error.NotFound,
        Store.openBeside("missing", 1, false, true, "side", &buffer),
    );
    const dir = try io.openDir(path);
    const file = try io.createFile(dir, "side", true);
    try io.write(file, "0123456789", 0);
    io.closeFile(file);
    io.closeDir(dir);
    // A longer file: its first buffer.len bytes, with the store.
    const long = (try Store.openBeside(path, 1, false, true, "side", &buffer)).?;
    try testing.expectEqual(@as(usize, 8), long.side_bytes);
    try testing.expectEqualStrings("01234567", &buffer);
    try testing.expectEqual(@as(u64, 1), long.store.count());
    const identity = try long.store.identity();
    long.store.close();
    // A shorter one: all of it; the same directory, so the same identity.
    var wide: [64]u8 = undefined;
    const short = (try Store.openBeside(path, 1, false, true, "side", &wide)).?;
    defer short.store.close();
    try testing.expectEqualStrings("0123456789", wide[0..short.side_bytes]);
    try testing.expectEqual(identity, try short.store.identity());
    // A directory with the side file but no store is refused, as `.refuse` does.
    try io.makePath("no-store");
    const bare = try io.openDir("no-store");
    const side = try io.createFile(bare, "side", true);
    io.closeFile(side);
    io.closeDir(bare);
    try testing.expectError(
        error.NotAStore,
        Store.openBeside("no-store", 1, false, true, "side", &buffer),
    );
    // Each of its calls failing in turn: an error (or an open that took
    // another way past it: the settle check's journal), and no handle left.
    const handles = simulated.openHandles();
    for ([_]simulated.Kind{ .open, .read, .length, .lock, .map }) |kind| {
        for (0..12) |at| {
            simulated.injectFault(kind, simulated.kindCount(kind) + at, .eio);
            const outcome = Store.openBeside(path, 1, false, true, "side", &buffer);
            const fired = simulated.clearFault();
            if (outcome) |opened| {
                try testing.expectEqual(@as(u64, 1), opened.?.store.count());
                opened.?.store.close();
            } else |_| try testing.expect(fired);
            try testing.expectEqual(handles, simulated.openHandles());
        }
    }
}

test "delete in both modes matches repeated swap-remove and order-keeping removal" {
    for ([_]bool{ false, true }) |keep_order| {
        simulated.reset();
        const path = "delete";
        const store = try Store.open(path, 1, true, true);
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

test "a fixed append in pieces sums every block; a durable or new store starts write-back" {
    // Rows of 7 bytes: blocks and pieces end mid-row, and each append after
    // the first starts in a partly filled block.
    const row = 7;
    const rows = ((5 << 20) / row) + 3; // more than two write-back steps
    const source = try allocator.alloc(u8, rows * row);
    defer allocator.free(source);
    var prng = std.Random.DefaultPrng.init(5);
    prng.random().bytes(source);
    const offsets = try allocator.alloc(u64, rows);
    defer allocator.free(offsets);
    for (offsets, 0..) |*offset, k| offset.* = k * row;
    for ([_]bool{ true, false }) |durable| {
        simulated.reset();
        const store = try Store.open("pieces", 2, true, durable);
        defer store.close();
        const before_create = simulated.writebackStarted().calls;
        _ = try store.append(source[0 .. 3 * row], offsets[0..3], .raw);
        try testing.expectEqual(
            before_create,
            simulated.writebackStarted().calls,
        ); // below one step
        const before = simulated.writebackStarted().calls;
        _ = try store.append(source[3 * row ..], offsets[0 .. rows - 3], .raw);
        const started = simulated.writebackStarted();
        try testing.expectEqual(if (durable) before + 3 else before, started.calls);
        if (durable) try testing.expectEqual(@as(u64, rows * row), started.end);
        const damaged = try allocator.alloc(u64, rows);
        defer allocator.free(damaged);
        try testing.expectEqual(@as(u64, 0), try store.verify(0, rows, damaged));
        var back: [row]u8 = undefined;
        for ([_]u64{ 0, 3, rows / 2, rows - 1 }) |index| {
            try store.gather(&.{index}, &back, &.{0});
            try testing.expectEqualSlices(u8, source[index * row ..][0..row], &back);
        }
    }
}

test "a staged store is created without syncs; sync() or a durable append makes it durable" {
    for (0..8) |seed| {
        simulated.reset();
        try io.makePath("staged");
        const files_before = simulated.kindCount(.sync_file);
        const dirs_before = simulated.kindCount(.sync_dir);
        const store = try Store.openWith("staged", 1, true, true, .create_staged);
        try testing.expectEqual(files_before, simulated.kindCount(.sync_file));
        try testing.expectEqual(dirs_before, simulated.kindCount(.sync_dir));
        try store.sync();
        try testing.expect(
            simulated.kindCount(.sync_file) > files_before and
                simulated.kindCount(.sync_dir) > dirs_before,
        );
        store.close();
        simulated.powerLoss(seed);
        const reopened = try Store.open("staged", 1, true, true);
        try testing.expectEqual(@as(u64, 0), reopened.head().count());
        reopened.close();
    }
    for (0..8) |seed| {
        simulated.reset();
        try io.makePath("staged");
        const store = try Store.openWith("staged", 1, true, true, .create_staged);
        _ = try store.append("abcdefgh", &.{ 0, 4 }, .raw);
        const syncs = simulated.kindCount(.sync_file) + simulated.kindCount(.sync_dir);
        try store.sync(); // nothing left to sync
        try testing.expectEqual(
            syncs,
            simulated.kindCount(.sync_file) + simulated.kindCount(.sync_dir),
        );
        store.close();
        simulated.powerLoss(seed);
        const reopened = try Store.open("staged", 1, true, true);
        defer reopened.close();
        var back: [8]u8 = undefined;
        try reopened.gather(&.{ 1, 0 }, &back, &.{ 0, 4 });
        try testing.expectEqualStrings("efghabcd", &back);
    }
}

test "an open that finds the journal at its page alone resets a stale shared page" {
    // The lock file is never synced: a power loss can leave its page odd
    // (written back mid-replace) or with an old tail checksum after a later
    // checkpoint cut the journal back to its page. The fast path of
    // journal.settle must still rewrite it, or every read would wait on it.
    simulated.reset();
    const path = "settle-page";
    const rows = [_]u8{7} ** 40;
    const offsets = [_]u64{ 0, 10, 20, 30 };
    const writer = try Store.open(path, 1, false, true);
    _ = try writer.append(&rows, &offsets, .raw);
    const superblock = writer.head().superblock;
    writer.close();
    try testing.expect(superblock.journal_file != 0 and superblock.tail_checksum != 0);

    const dir = try io.openDir(path);
    defer io.closeDir(dir);
    var name_buffer: [format.file_name_bytes]u8 = undefined;
    const journal_file = try io.openFile(
        dir,
        format.fileName(&name_buffer, .journal, superblock.journal_file),
        .read_only,
    );
    try testing.expectEqual(format.journal_page_bytes, try io.length(journal_file));
    io.closeFile(journal_file);
    const lock = try io.openFile(dir, seqlock.lock_file_name, .read_write);
    var page: format.JournalPage = undefined;
    _ = try io.read(lock, std.mem.asBytes(&page), 0);
    page.sequence_lock = 5;
    page.tail_generation = superblock.generation;
    page.tail_checksum = superblock.tail_checksum ^ 1;
    try io.write(lock, std.mem.asBytes(&page), 0);
    io.closeFile(lock);

    const reader = try Store.open(path, 1, true, true);
    defer reader.close();
    const shared = reader.head().journalPage().?;
    try testing.expectEqual(@as(u64, 0), seqlock.readBegin(shared) % 2);
    try testing.expectEqual(
        superblock.tail_checksum,
        seqlock.tailChecksum(shared, &reader.head().superblock),
    );
    var target: [40]u8 = undefined;
    try reader.gather(&.{ 0, 1, 2, 3 }, &target, null);
    try testing.expectEqualSlices(u8, &rows, &target);
}

test "a reader's open of a settled store only reads: no write, no writable map of the shared page" {
    simulated.reset();
    const path = "settled-open";
    var rows = [_]u8{7} ** 40;
    const offsets = [_]u64{ 0, 10, 20, 30 };
    const writer = try Store.open(path, 1, false, true);
    _ = try writer.append(&rows, &offsets, .raw);
    @memset(rows[10..20], 9);
    try writer.replace(&.{1}, rows[10..20], offsets[0..1], .raw);
    writer.close();

    const writes = simulated.kindCount(.write);
    const maps = simulated.kindCount(.map);
    const reader = try Store.open(path, 1, true, true);
    defer reader.close();
    try testing.expectEqual(writes, simulated.kindCount(.write));
    // The shared page, the data and the sums, each mapped read-only once.
    try testing.expectEqual(maps + 3, simulated.kindCount(.map));
    var target: [40]u8 = undefined;
    try reader.gather(&.{ 0, 1, 2, 3 }, &target, null);
    try testing.expectEqualSlices(u8, &rows, &target);
}

test "regression: a small record after one larger than a growth step does not zero it" {
    // Found by the SIGKILL suite: a record larger than `grow_bytes` extended
    // the journal past `allocated`, and the next small record's growth
    // wrote zeros over it, so replay after a kill stopped there and lost it
    // and every later replace.
    simulated.reset();
    const stride = 100;
    const count = 60;
    var rows: [count * stride]u8 = undefined;
    var offsets: [count]u64 = undefined;
    var all: [count]u64 = undefined;
    for (&offsets, &all, 0..) |*offset, *index, k| {
        offset.* = k * stride;
        index.* = k;
    }
    @memset(&rows, 1);
    const store = try Store.open("replay", 1, true, true);
    _ = try store.append(&rows, &offsets, .raw);
    for ([_]usize{ 1, count, 1, 1 }, 2..) |replaced, value| {
        @memset(rows[0 .. replaced * stride], @intCast(value));
        try store.replace(
            all[0..replaced],
            rows[0 .. replaced * stride],
            offsets[0..replaced],
            .raw,
        );
    }
    // Killed: the handle is dropped without close (no checkpoint).
    simulated.processCrash();
    const reader = try Store.open("replay", 1, true, true);
    defer reader.close();
    var target: [count * stride]u8 = undefined;
    try reader.gather(&all, &target, null);
    for (target[0..stride]) |byte| try testing.expectEqual(@as(u8, 5), byte);
    for (target[stride..]) |byte| try testing.expectEqual(@as(u8, 3), byte);
}

/// A test's `count` rows of `stride` bytes: the rows, their packed
/// offsets, and every index.
const TestRows = struct {
    rows: []u8,
    offsets: []u64,
    all: []u64,

    fn init(count: usize, stride: usize) !TestRows {
        const rows = try allocator.alloc(u8, count * stride);
        errdefer allocator.free(rows);
        const offsets = try allocator.alloc(u64, count);
        errdefer allocator.free(offsets);
        const all = try allocator.alloc(u64, count);
        for (offsets, all, 0..) |*offset, *index, k| {
            offset.* = k * stride;
            index.* = k;
        }
        return .{ .rows = rows, .offsets = offsets, .all = all };
    }

    fn deinit(test_rows: TestRows) void {
        allocator.free(test_rows.rows);
        allocator.free(test_rows.offsets);
        allocator.free(test_rows.all);
    }
};

test "computeSums on two threads finds the blocks, sums and tail the one-thread walk does" {
    simulated.reset();
    const stride = 40; // rows cross block edges
    const count = 200_000; // 489 blocks, the last partial
    const test_rows = try TestRows.init(count, stride);
    defer test_rows.deinit();
    for (test_rows.rows, 0..) |*byte, k| byte.* = @truncate(k *% 7);
    const rows, const offsets = .{ test_rows.rows, test_rows.offsets };
    const store = try Store.open("sums", 2, true, true);
    defer store.close();
    _ = try store.append(rows, offsets, .raw);
    try store.replace(test_rows.all[0..1], rows[0..stride], offsets[0..1], .raw);
    const base = store.head();
    const target = try store.writer.?.target.get(store.dir, &base.superblock);
    const scratch = try allocator.alloc(u8, journal.run_blocks_max * format.block_bytes);
    defer allocator.free(scratch);
    const patches = try allocator.alloc(plans.Patch, count);
    defer allocator.free(patches);
    var prng = std.Random.DefaultPrng.init(29);
    // Rows 1,000 apart (40,000 bytes: each its own group), 819 apart (the
    // next block or the one after: groups of one row and of several),
    // random gaps of up to 2,000 rows, and 3,000 adjacent rows (one group:
    // nothing to split); the sparse ones end at the last row, in the
    // partial block.
    const Spacing = struct { step: u64, rows: usize, split: bool };
    for ([_]Spacing{
        .{ .step = 1_000, .rows = 200, .split = true },
        .{ .step = 819, .rows = 244, .split = true },
        .{ .step = 0, .rows = 190, .split = true },
        .{ .step = 1, .rows = 3_000, .split = false },
    }) |spacing| {
        var used: usize = 0;
        var row: u64 = 0;
        while (used < spacing.rows and row < count - 1) : (used += 1) {
            const source = (count - 1 - row) * stride; // rows of other values
            patches[used] = .{ .row = row, .bytes = rows[source..][0..stride] };
            const random_gap = 1 + prng.random().uintLessThan(u64, 2_000);
            row += if (spacing.step == 0) random_gap else spacing.step;
        }
        if (spacing.split) {
            patches[used] = .{ .row = count - 1, .bytes = rows[0..stride] };
            used += 1;
        }
        var one = journal.Sums{};
        defer one.deinit();
        try journal.forEachRun(target, patches[0..used], scratch, base, &one, journal.Sums.visit);
        var two = journal.Sums{};
        defer two.deinit();
        try journal.computeSums(target, patches[0..used], scratch, base, 2, &two);
        try testing.expectEqualSlices(u64, one.blocks.items, two.blocks.items);
        try testing.expectEqualSlices(u64, one.sums.items, two.sums.items);
        try testing.expectEqual(one.tail_checksum, two.tail_checksum);
        try testing.expectEqual(one.runs, two.runs);
        try testing.expectEqual(spacing.split, one.tail_checksum != null);
        // A split merges the parts' lists and leaves no image to write again.
        try testing.expectEqual(spacing.split, two.last_image.len == 0);
    }
}

test "a live replace stores small rows through the writer's mappings, large ones by pwrite" {
    // Both modes: the journal's (durable) and the undo area's paths.
    for ([_]bool{ true, false }) |durable| {
        simulated.reset();
        const stride = 40;
        const count = 40_000; // 1.6 MB: more rows than `journal.patch_bytes_max` holds
        const test_rows = try TestRows.init(count, stride);
        defer test_rows.deinit();
        const rows, const offsets = .{ test_rows.rows, test_rows.offsets };
        const all = test_rows.all;
        @memset(rows, 1);
        const store = try Store.open("patched", 1, true, durable);
        defer store.close();
        _ = try store.append(rows, offsets, .raw);
        try store.sync();
        // The first replace of a store creates its journal: not counted.
        try store.replace(all[0..1], rows[0..stride], offsets[0..1], .raw);
        // Three scattered rows: no pwrite of the data or sums files (the
        // journal's record, or the undo area's, are written as before).
        @memset(rows[0 .. 3 * stride], 2);
        const scattered = [_]u64{ 7, 20_000, 39_999 };
        const writes = simulated.kindCount(.write);
        const patches = simulated.kindCount(.patch);
        try store.replace(&scattered, rows[0 .. 3 * stride], offsets[0..3], .raw);
        // A record (or block images), at most 2 writes; 3 rows and 2 sums
        // stored (row 39,999 is in the partial last block, whose checksum
        // is the superblock's).
        try testing.expect(simulated.kindCount(.write) - writes <= 2);
        try testing.expectEqual(patches + 5, simulated.kindCount(.patch));
        // Every row: whole runs by pwrite, no store through a mapping.
        @memset(rows, 3);
        const before = simulated.kindCount(.patch);
        try store.replace(all, rows, offsets, .raw);
        try testing.expectEqual(before, simulated.kindCount(.patch));
        @memset(rows[0 .. 3 * stride], 4);
        try store.replace(&scattered, rows[0 .. 3 * stride], offsets[0..3], .raw);
        const target = try allocator.alloc(u8, count * stride);
        defer allocator.free(target);
        try store.gather(all, target, null);
        for (0..count) |row| {
            const expected: u8 = if (row == 7 or row == 20_000 or row == 39_999) 4 else 3;
            try testing.expect(std.mem.allEqual(u8, target[row * stride ..][0..stride], expected));
        }
        const damaged = try allocator.alloc(u64, count);
        defer allocator.free(damaged);
        try testing.expectEqual(@as(u64, 0), try store.verify(0, count, damaged));
    }
}

test "durable=False: a replace finding many blocks unsaved saves its rows' ranges" {
    // And a kill after a block saved by ranges was saved whole restores
    // the last sync (the records are written back newest first).
    simulated.reset();
    const stride = 40; // rows cross block edges: 16 KiB is not a multiple
    const count = 40_000; // 98 blocks, the last partial
    const test_rows = try TestRows.init(count, stride);
    defer test_rows.deinit();
    const rows, const offsets = .{ test_rows.rows, test_rows.offsets };
    const all = test_rows.all;
    @memset(rows, 1);
    const store = try Store.open("ranges", 1, true, false);
    _ = try store.append(rows, offsets, .raw);
    try store.replace(all[0..1], rows[0..stride], offsets[0..1], .raw); // creates the undo file
    try store.sync();
    // 100 rows 16,000 bytes apart, one or two per block, the last in the
    // partial block: range records of 88 bytes (a row across a block edge
    // makes two), not 98 block images.
    var scattered: [100]u64 = undefined;
    for (&scattered, 0..) |*row, k| row.* = k * 400;
    scattered[99] = count - 1;
    @memset(rows[0 .. 100 * stride], 2);
    try store.replace(&scattered, rows[0 .. 100 * stride], offsets[0..100], .raw);
    const saved = store.writer.?.undo.end;
    try testing.expect(saved >= 100 * 88 and saved <= 102 * 88);
    // The same rows again: their ranges are saved, so no record, no sync.
    const syncs = simulated.kindCount(.sync_file);
    try store.replace(&scattered, rows[0 .. 100 * stride], offsets[0..100], .raw);
    try testing.expectEqual(saved, store.writer.?.undo.end);
    try testing.expectEqual(syncs, simulated.kindCount(.sync_file));
    // Block 5 nearly whole (range-saved, row 2,400 patched): now saved as
    // a block, its image holding the patched row, which the older range
    // record of that row undoes on recovery.
    const block_rows = format.block_bytes / stride;
    const first = 5 * block_rows + 1;
    const run = rows[0 .. block_rows * stride];
    @memset(run, 3);
    try store.replace(all[first..][0..block_rows], run, offsets[0..block_rows], .raw);
    const target = try allocator.alloc(u8, count * stride);
    defer allocator.free(target);
    try store.gather(all, target, null);
    for (0..count) |row| {
        const in_run = row >= first and row < first + block_rows;
        const scattered_row = (row % 400 == 0 and row < 99 * 400) or row == count - 1;
        const expected: u8 = if (in_run) 3 else if (scattered_row) 2 else 1;
        try testing.expectEqual(expected, target[row * stride]);
    }
    // Killed: the handle is dropped without close (no sync).
    simulated.processCrash();
    const reader = try Store.open("ranges", 1, true, true);
    defer reader.close();
    try reader.gather(all, target, null);
    try testing.expect(std.mem.allEqual(u8, target, 1));
    const damaged = try allocator.alloc(u64, count);
    defer allocator.free(damaged);
    try testing.expectEqual(@as(u64, 0), try reader.verify(0, count, damaged));
}

test "durable=False: a row wider than a block saves the block inside it" {
    // Rows 3 and 5 save blocks 3, 4, 6 and 7, the end blocks of row 4; a
    // replace of row 4 alone must still save block 5, which lies inside it.
    simulated.reset();
    const stride = 20_000;
    const count = 8;
    const test_rows = try TestRows.init(count, stride);
    defer test_rows.deinit();
    const rows, const offsets = .{ test_rows.rows, test_rows.offsets };
    const all = test_rows.all;
    @memset(rows, 1);
    const store = try Store.open("wide", 1, true, false);
    _ = try store.append(rows, offsets, .raw);
    try store.replace(all[0..1], rows[0..stride], offsets[0..1], .raw); // creates the undo file
    try store.sync();
    @memset(rows[0 .. 2 * stride], 2);
    try store.replace(&.{ 3, 5 }, rows[0 .. 2 * stride], offsets[0..2], .raw);
    const saved = store.writer.?.undo.end;
    try testing.expect(!store.writer.?.undo.saved.isSet(5));
    try store.replace(&.{4}, rows[0..stride], offsets[0..1], .raw);
    try testing.expect(store.writer.?.undo.saved.isSet(5));
    try testing.expect(store.writer.?.undo.end > saved);
    simulated.processCrash();
    const reader = try Store.open("wide", 1, true, true);
    defer reader.close();
    const target = try allocator.alloc(u8, count * stride);
    defer allocator.free(target);
    try reader.gather(all, target, null);
    try testing.expect(std.mem.allEqual(u8, target, 1));
}

test "a replace of rows back to back in memory (no copy) survives a kill and a reopen" {
    // Covers the zero-copy paths: runs the rows cover whole (`covering`,
    // with `runEnd` splitting off the two edge blocks) and rows written
    // to the journal straight from the caller (`direct_bytes_min`), live
    // and in replay; and rows out of memory order, which take the
    // copying path.
    simulated.reset();
    const stride = 100;
    const count = 2000;
    const test_rows = try TestRows.init(count, stride);
    defer test_rows.deinit();
    const rows, const offsets = .{ test_rows.rows, test_rows.offsets };
    const all = test_rows.all;
    const model = try allocator.alloc(u8, count * stride);
    defer allocator.free(model);
    for (model, 0..) |*byte, k| byte.* = @truncate(k *% 7);
    const store = try Store.open("direct", 1, true, true);
    _ = try store.append(model, offsets, .raw);
    // Rows 150..1850 in order, back to back: 170 KB, whole blocks inside.
    const first = 150;
    const replaced = 1700;
    for (rows[0 .. replaced * stride], 0..) |*byte, k| byte.* = @truncate(k *% 13 +% 1);
    const read_before = simulated.readBytes();
    try store.replace(
        all[first..][0..replaced],
        rows[0 .. replaced * stride],
        offsets[0..replaced],
        .raw,
    );
    // Only the two edge blocks are read (for their sums, and again to
    // apply them), and a journal header: not the ten whole blocks between.
    try testing.expect(simulated.readBytes() - read_before <= 4 * format.block_bytes + 4096);
    @memcpy(model[first * stride ..][0 .. replaced * stride], rows[0 .. replaced * stride]);
    // Rows 10, 9, ..., 1 from the front of `rows`: sorted by row, their
    // bytes run backwards in memory.
    var backwards: [10]u64 = undefined;
    for (&backwards, 0..) |*index, k| index.* = 10 - k;
    @memset(rows[0 .. 10 * stride], 0xee);
    for (0..10) |k| rows[k * stride] = @intCast(k);
    try store.replace(&backwards, rows[0 .. 10 * stride], offsets[0..10], .raw);
    for (backwards, 0..) |row, k| @memcpy(
        model[row * stride ..][0..stride],
        rows[k * stride ..][0..stride],
    );
    const target = try allocator.alloc(u8, count * stride);
    defer allocator.free(target);
    try store.gather(all, target, null);
    try testing.expectEqualSlices(u8, model, target);
    // The block sums of the runs hashed from the caller's memory match.
    const damaged = try allocator.alloc(u64, count);
    defer allocator.free(damaged);
    try testing.expectEqual(@as(u64, 0), try store.verify(0, count, damaged));
    // Killed before a checkpoint: a reader replays both records.
    simulated.processCrash();
    const reader = try Store.open("direct", 1, true, true);
    defer reader.close();
    @memset(target, 0);
    try reader.gather(all, target, null);
    try testing.expectEqualSlices(u8, model, target);
    try testing.expectEqual(@as(u64, 0), try reader.verify(0, count, damaged));
}
