//! The shared page: 64 bytes at the start of the store's lock file, mapped
//! by the writer and by every reader of a fixed store. Its sequence lock is
//! how a reader sees one settled state; it also names the tail checksum of
//! the current generation and the newest generation a writer synced.
//!
//! Invariant: the sequence lock is odd exactly while committed bytes are
//! changing in place (journal.zig's replace, replay and settle); a reader
//! that saw it even before a read and unchanged after read one committed
//! state whole. The page is volatile (the lock file is never synced):
//! nothing in it is trusted after a crash until a writer or a settling
//! reader rewrote it, and `synced_generation` counts only with its check.
const std = @import("std");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");

const assert = std.debug.assert;
const Error = status.Error;
const Superblock = format.Superblock;
const JournalPage = format.JournalPage;

fn pageOf(memory: io.WritableMemory) *JournalPage {
    // `mapPage` maps at least the page; every caller passes its mapping.
    assert(memory.len >= shared_page_bytes);
    return @ptrCast(memory.ptr);
}

/// Makes the sequence lock odd: gathers that overlap the change retry.
pub fn lockPage(memory: io.WritableMemory) void {
    const word = &pageOf(memory).sequence_lock;
    const value = @atomicLoad(u64, word, .seq_cst);
    @atomicStore(u64, word, value | 1, .seq_cst);
    assert(@atomicLoad(u64, word, .seq_cst) % 2 == 1);
}

/// Names `generation` and its tail checksum in the page, and makes the
/// sequence lock even again.
pub fn unlockPage(memory: io.WritableMemory, generation: u64, tail_checksum: u64) void {
    const shared = pageOf(memory);
    @atomicStore(u64, &shared.tail_checksum, tail_checksum, .seq_cst);
    @atomicStore(u64, &shared.tail_generation, generation, .seq_cst);
    const value = @atomicLoad(u64, &shared.sequence_lock, .seq_cst);
    @atomicStore(u64, &shared.sequence_lock, (value | 1) +% 1, .seq_cst);
    assert(@atomicLoad(u64, &shared.sequence_lock, .seq_cst) % 2 == 0);
    assert(@atomicLoad(u64, &shared.tail_generation, .seq_cst) == generation);
}

/// Records in the page that `generation` is durable. Called only after its
/// slot was synced; the check goes last, so a reader that sees the pair
/// half written takes it for no record.
pub fn recordSynced(memory: io.WritableMemory, generation: u64) void {
    assert(generation > 0);
    const shared = pageOf(memory);
    @atomicStore(u64, &shared.synced_check, 0, .seq_cst);
    @atomicStore(u64, &shared.synced_generation, generation, .seq_cst);
    @atomicStore(u64, &shared.synced_check, format.syncedCheck(generation), .seq_cst);
    // The pair a reader accepts (`syncedGeneration`).
    assert(shared.synced_check == format.syncedCheck(shared.synced_generation));
}

/// The newest generation a writer of the store in `dir` recorded as
/// durable (`recordSynced`), or null when its lock file holds no such
/// record. Evidence only: any failure to read it is no record.
/// Called on a path that has not failed: a failure here leaves no message.
pub fn syncedGeneration(dir: io.Dir) ?u64 {
    if (!io.exists(dir, lock_file_name)) return null;
    const file = io.openFile(dir, lock_file_name, .read_only) catch {
        status.clear();
        return null;
    };
    defer io.closeFile(file);
    var page: JournalPage = undefined;
    const got = io.read(file, std.mem.asBytes(&page), 0) catch {
        status.clear();
        return null;
    };
    assert(got <= @sizeOf(JournalPage));
    if (got != @sizeOf(JournalPage) or !std.mem.eql(u8, &page.magic, &format.journal_magic))
        return null;
    if (page.synced_check != format.syncedCheck(page.synced_generation)) return null;
    return page.synced_generation;
}

/// Maps the shared page of `lock_file` (open read-write), writing a fresh
/// page first when it holds none.
pub fn mapPage(lock_file: io.File) Error!io.WritableMemory {
    try ensureSharedPage(lock_file);
    const memory = try io.mapWritable(lock_file, shared_page_bytes);
    assert(memory.len >= shared_page_bytes);
    return memory;
}

/// The shared page lives in the lock file, which is never synced: the
/// journal file is synced on every replace, and a page in it would be
/// written back and write-protected each time, so that every sequence-lock
/// store through the mapping took a page fault (4 ms on ext4 here). The
/// page is volatile: nothing in it is trusted after a crash until a writer
/// or a settling reader rewrote it.
pub const lock_file_name = "lock";

/// What the lock file holds: the shared page's 64 bytes, not a whole page
/// (a 4 KiB file per store was 0.01% of a 40 MB array). Mappings still
/// cover a page; only these bytes are ever read or written.
pub const shared_page_bytes: u64 = @sizeOf(JournalPage);

/// Writes a fresh page into the lock file when it holds none (a new store,
/// or a power loss took it). Caller holds the writer lock.
pub fn ensureSharedPage(file: io.File) Error!void {
    var page: JournalPage = undefined;
    // A whole page read from offset 0: the file holds at least the page.
    const got = try io.read(file, std.mem.asBytes(&page), 0);
    assert(got <= @sizeOf(JournalPage));
    if (got == @sizeOf(JournalPage) and std.mem.eql(u8, &page.magic, &format.journal_magic)) return;
    page = std.mem.zeroes(JournalPage);
    page.magic = format.journal_magic;
    page.version = format.journal_version;
    // What `syncedGeneration` takes for no record: the check is never 0.
    assert(page.synced_check != format.syncedCheck(page.synced_generation));
    try io.write(file, std.mem.asBytes(&page), 0);
}

/// Whether a reader's gather may use the snapshot's bytes: the lock word
/// was even before and unchanged after.
pub fn readBegin(page: *const JournalPage) u64 {
    return @atomicLoad(u64, &page.sequence_lock, .seq_cst);
}

/// The tail checksum a reader of generation `superblock` must check against.
pub fn tailChecksum(page: ?*const JournalPage, superblock: *const Superblock) u64 {
    const shared = page orelse return superblock.tail_checksum;
    if (!std.mem.eql(u8, &shared.magic, &format.journal_magic)) return superblock.tail_checksum;
    const tail_generation = @atomicLoad(u64, &shared.tail_generation, .seq_cst);
    if (tail_generation != superblock.generation) return superblock.tail_checksum;
    return @atomicLoad(u64, &shared.tail_checksum, .seq_cst);
}
