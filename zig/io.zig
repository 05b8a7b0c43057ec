//! The I/O seam: every file-system call zrecord makes goes through this file,
//! and every OS error message is made here. No other file of the store calls
//! `std.fs` or `std.posix` (tests/test_native.py fails if one does).
//!
//! The backend is chosen at compile time: the library talks to the OS
//! (`Os`, below); the Zig test binary talks to the simulated storage of
//! `testing/storage.zig`, which loses power, tears sectors and fails calls on
//! cue. The production build pays nothing for the seam: every function here
//! is a direct call into the backend, inlined by the compiler.
//!
//! Handles are plain integers (a descriptor for the OS, a slot in the
//! simulator's table), wrapped with the names the error messages need.
const std = @import("std");
const builtin = @import("builtin");
const format = @import("format.zig");
const status = @import("status.zig");

const posix = std.posix;
const assert = std.debug.assert;
const Error = status.Error;

pub const page_size = std.heap.page_size_min;
pub const Memory = []align(page_size) const u8;

const backend = if (builtin.is_test) @import("testing/storage.zig") else Os;

pub const Dir = struct {
    handle: i32,
    path: []const u8,
};

pub const File = struct {
    handle: i32,
    dir_path: []const u8,
    name_buffer: [name_bytes_max]u8,
    name_len: u8,

    /// Long enough for every file of a store and its temporary superblock.
    pub const name_bytes_max = format.file_name_bytes;

    pub fn name(file: *const File) []const u8 {
        return file.name_buffer[0..file.name_len];
    }
};

fn makeFile(handle: i32, dir: Dir, name: []const u8) File {
    assert(name.len <= File.name_bytes_max);
    var file = File{
        .handle = handle,
        .dir_path = dir.path,
        .name_buffer = undefined,
        .name_len = @intCast(name.len),
    };
    @memcpy(file.name_buffer[0..name.len], name);
    return file;
}

// ---- errors: the one place that turns an OS error into a message -----------

fn failDir(err: anyerror, comptime verb: []const u8, dir_path: []const u8) Error {
    return status.fromOs(err, errnoOf(err), "cannot " ++ verb ++ " '{s}'", .{dir_path});
}

fn failFile(
    err: anyerror,
    comptime verb: []const u8,
    dir_path: []const u8,
    name: []const u8,
) Error {
    return status.fromOs(
        err,
        errnoOf(err),
        "cannot " ++ verb ++ " '{s}' in '{s}'",
        .{ name, dir_path },
    );
}

/// The errno an OS error of std.fs / std.posix stands for (0 when it names
/// none), so that Python raises the OSError the errno says.
pub fn errnoOf(err: anyerror) i32 {
    const E = std.posix.E;
    const value: E = switch (err) {
        error.NoSpaceLeft => .NOSPC,
        error.DiskQuota => .DQUOT,
        error.FileTooBig => .FBIG,
        error.ReadOnlyFileSystem => .ROFS,
        error.AccessDenied => .ACCES,
        error.PermissionDenied => .PERM,
        error.FileNotFound => .NOENT,
        error.NameTooLong => .NAMETOOLONG,
        error.InputOutput => .IO,
        error.NotDir => .NOTDIR,
        error.IsDir => .ISDIR,
        error.SymLinkLoop => .LOOP,
        error.ProcessFdQuotaExceeded => .MFILE,
        error.SystemFdQuotaExceeded => .NFILE,
        error.SystemResources, error.OutOfMemory => .NOMEM,
        error.LockedMemoryLimitExceeded => .AGAIN,
        error.PathAlreadyExists => .EXIST,
        error.DeviceBusy => .BUSY,
        error.NoDevice => .NODEV,
        error.LinkQuotaExceeded => .MLINK,
        error.NotSameFileSystem => .XDEV,
        else => .SUCCESS,
    };
    return @intCast(@intFromEnum(value));
}

test "every OS error the seam reports names its errno" {
    const cases = [_]struct { err: anyerror, errno: std.posix.E, kind: Error }{
        .{ .err = error.NoSpaceLeft, .errno = .NOSPC, .kind = error.NoSpace },
        .{ .err = error.DiskQuota, .errno = .DQUOT, .kind = error.NoSpace },
        .{ .err = error.FileTooBig, .errno = .FBIG, .kind = error.NoSpace },
        .{ .err = error.ReadOnlyFileSystem, .errno = .ROFS, .kind = error.ReadOnly },
        .{ .err = error.AccessDenied, .errno = .ACCES, .kind = error.ReadOnly },
        .{ .err = error.PermissionDenied, .errno = .PERM, .kind = error.ReadOnly },
        .{ .err = error.NameTooLong, .errno = .NAMETOOLONG, .kind = error.Io },
        .{ .err = error.FileNotFound, .errno = .NOENT, .kind = error.NotFound },
        .{ .err = error.InputOutput, .errno = .IO, .kind = error.Io },
    };
    for (cases) |case| {
        status.clear();
        try std.testing.expectEqual(
            case.kind,
            status.fromOs(case.err, errnoOf(case.err), "cannot do it", .{}),
        );
        try std.testing.expectEqual(@as(i32, @intCast(@intFromEnum(case.errno))), status.osErrno());
        try std.testing.expect(status.message().len > 0);
    }
    status.clear();
    try std.testing.expectEqual(@as(i32, 0), status.osErrno());
}

// ---- directories ----------------------------------------------------------

/// Opens directory `path`; error.NotFound if it does not exist, error.NotAStore
/// if it is a file.
pub fn openDir(path: []const u8) Error!Dir {
    const handle = backend.openDir(path) catch |err| switch (err) {
        error.FileNotFound => return status.fail(error.NotFound, "'{s}' does not exist", .{path}),
        error.NotDir => return status.fail(
            error.NotAStore,
            "'{s}' is a file, not a store directory",
            .{path},
        ),
        else => return failDir(err, "open directory", path),
    };
    return .{ .handle = handle, .path = path };
}

pub fn closeDir(dir: Dir) void {
    backend.close(dir.handle);
}

/// Creates directory `path` and any missing parents, and makes each new
/// entry durable by syncing the directory that holds it: a store whose data
/// was synced must not vanish with its directory entry after a power cut.
pub fn makePath(path: []const u8) Error!void {
    var iterator = std.fs.path.componentIterator(path) catch |err| return failDir(
        err,
        "create directory",
        path,
    );
    while (iterator.next()) |component| {
        backend.makeDir(component.path) catch |err| switch (err) {
            error.PathAlreadyExists => continue,
            else => return failDir(err, "create directory", component.path),
        };
        try syncParent(component.path);
    }
}

/// Syncs the directory that holds the entry `path`.
pub fn syncParent(path: []const u8) Error!void {
    const parent = std.fs.path.dirname(path) orelse if (std.fs.path.isAbsolute(path)) "/" else ".";
    const handle = backend.openDir(parent) catch |err| return failDir(
        err,
        "open directory",
        parent,
    );
    defer backend.close(handle);
    backend.syncDir(handle) catch |err| return failDir(err, "sync directory", parent);
}

pub fn syncDir(dir: Dir) Error!void {
    backend.syncDir(dir.handle) catch |err| return failDir(err, "sync directory", dir.path);
}

pub fn exists(dir: Dir, name: []const u8) bool {
    return backend.exists(dir.handle, name);
}

/// Creates `new` as a second name of `old`. Returns false, changing nothing,
/// when `new` exists already.
pub fn link(dir: Dir, old: []const u8, new: []const u8) Error!bool {
    backend.link(dir.handle, old, new) catch |err| switch (err) {
        error.PathAlreadyExists => return false,
        else => return failFile(err, "link", dir.path, new),
    };
    return true;
}

pub fn unlink(dir: Dir, name: []const u8) Error!void {
    backend.unlink(dir.handle, name) catch |err| return failFile(err, "delete", dir.path, name);
}

/// Deletes `name` now and frees its blocks later, on another thread: the
/// name is gone when this returns, but the file system's work of evicting
/// and freeing a large file (11–18 ms for 40 MB on ext4 here) is not on the
/// caller's time. For files no commit names any more.
pub fn unlinkDeferred(dir: Dir, name: []const u8) Error!void {
    backend.unlinkDeferred(dir.handle, name) catch |err| return failFile(
        err,
        "delete",
        dir.path,
        name,
    );
}

/// The names in a directory, one at a time (no order promised).
pub const Iterator = struct {
    inner: backend.Iterator,
    dir_path: []const u8,

    pub fn next(iterator: *Iterator) Error!?[]const u8 {
        return iterator.inner.next() catch |err| failDir(err, "list", iterator.dir_path);
    }
};

pub fn iterate(dir: Dir) Iterator {
    return .{ .inner = backend.iterate(dir.handle), .dir_path = dir.path };
}

// ---- files ------------------------------------------------------------------

pub const Open = enum { read_only, read_write };

/// Opens an existing file; error.NotFound (with a message) if it is missing.
pub fn openFile(dir: Dir, name: []const u8, mode: Open) Error!File {
    const handle = backend.openFile(
        dir.handle,
        name,
        mode == .read_write,
    ) catch |err| switch (err) {
        error.FileNotFound => return status.fail(
            error.NotFound,
            "file '{s}' is missing from '{s}'",
            .{ name, dir.path },
        ),
        else => return failFile(err, "open", dir.path, name),
    };
    return makeFile(handle, dir, name);
}

/// Creates a file (read-write), emptying it if it exists and `truncate` is set.
pub fn createFile(dir: Dir, name: []const u8, truncate: bool) Error!File {
    const handle = backend.createFile(dir.handle, name, truncate) catch |err| return failFile(
        err,
        "create",
        dir.path,
        name,
    );
    return makeFile(handle, dir, name);
}

pub fn closeFile(file: File) void {
    backend.close(file.handle);
}

/// The first `buffer.len` bytes of the small file `name` of `dir` (all of
/// a shorter one), read by one call: no second call to find the end. A
/// regular file reads short only at its end; the caller checks the bytes.
/// Null where `dir` has no such file. The bytes read are returned.
pub fn readSmallFile(dir: Dir, name: []const u8, buffer: []u8) Error!?usize {
    const handle = backend.openFile(dir.handle, name, false) catch |err| switch (err) {
        error.FileNotFound => return null,
        else => return failFile(err, "open", dir.path, name),
    };
    defer backend.close(handle);
    return backend.preadOnce(handle, buffer, 0) catch |err| failFile(
        err,
        "read",
        dir.path,
        name,
    );
}

/// The (device, inode) of directory `dir`: which directory the handle
/// opened, as a stat of its path then gave.
pub fn identity(dir: Dir) Error![2]u64 {
    return backend.identity(dir.handle) catch |err| failDir(err, "stat", dir.path);
}

/// Reads until `buffer` is full or the file ends; returns the bytes read.
pub fn read(file: File, buffer: []u8, offset: u64) Error!usize {
    return backend.pread(file.handle, buffer, offset) catch |err| failFile(
        err,
        "read",
        file.dir_path,
        file.name(),
    );
}

/// Writes all of `bytes` at `offset`.
pub fn write(file: File, bytes: []const u8, offset: u64) Error!void {
    backend.pwrite(file.handle, bytes, offset) catch |err| return failFile(
        err,
        "write",
        file.dir_path,
        file.name(),
    );
}

pub fn length(file: File) Error!u64 {
    return backend.length(file.handle) catch |err| failFile(
        err,
        "stat",
        file.dir_path,
        file.name(),
    );
}

pub fn setLength(file: File, bytes: u64) Error!void {
    backend.setLength(file.handle, bytes) catch |err| return failFile(
        err,
        "truncate",
        file.dir_path,
        file.name(),
    );
}

/// Starts writing `file`'s bytes [offset, offset + bytes) back to the
/// disk without waiting (sync_file_range WRITE), so that a later `sync`
/// finds most of them written: a rewrite overlaps its write-back with
/// producing the next rows. Durability still comes only from `sync`.
pub fn startWriteback(file: File, offset: u64, bytes: u64) void {
    backend.startWriteback(file.handle, offset, bytes);
}

/// Makes the file's bytes and length durable (fdatasync). A failure means
/// the kernel may have dropped the unsynced pages: the caller must not
/// commit anything that points at them.
pub fn sync(file: File) Error!void {
    backend.syncFile(file.handle) catch |err| return failFile(
        err,
        "sync",
        file.dir_path,
        file.name(),
    );
}

/// Takes an exclusive advisory lock (flock) without waiting; false if
/// another handle holds it. Closing the handle releases it.
pub fn tryLock(file: File) Error!bool {
    return backend.tryLock(file.handle) catch |err| failFile(
        err,
        "lock",
        file.dir_path,
        file.name(),
    );
}

// ---- mappings ---------------------------------------------------------------

pub const Advice = enum { random, will_need, huge_pages };

/// Maps `file` read-only, shared, reserving at least `reserve_bytes` of
/// address space so appends need no remap. The result is at least
/// `needed_bytes` long; bytes past the file's length are never read.
pub fn map(file: File, needed_bytes: u64, reserve_bytes: u64) Error!Memory {
    assert(needed_bytes <= reserve_bytes);
    const memory = backend.map(file.handle, reserve_bytes) catch |err| return failFile(
        err,
        "map",
        file.dir_path,
        file.name(),
    );
    if (memory.len < needed_bytes) {
        backend.unmap(memory);
        return status.fail(
            error.OutOfMemory,
            "cannot map {d} bytes of '{s}' in '{s}'",
            .{ needed_bytes, file.name(), file.dir_path },
        );
    }
    return memory;
}

pub fn unmap(memory: Memory) void {
    backend.unmap(memory);
}

pub const WritableMemory = []align(page_size) u8;

/// Maps the first `bytes` of `file` read-write and shared: a page that the
/// writer and readers in other processes see at once (the journal's
/// sequence lock). Writes through it are not durable until a sync.
pub fn mapWritable(file: File, bytes: u64) Error!WritableMemory {
    return backend.mapWritable(file.handle, bytes) catch |err| failFile(
        err,
        "map",
        file.dir_path,
        file.name(),
    );
}

pub fn unmapWritable(memory: WritableMemory) void {
    backend.unmap(memory);
}

/// Maps `file` read-write and shared for in-place patches of its bytes
/// (`writePatch`), reserving `reserve_bytes` of address space (past the
/// file's end too, never written there). On ext4 a `pwrite` costs about
/// 5 us whatever its length (the inode's times and the journal handle), a
/// store through a mapping a fault on the page's first write after each
/// write-back (about 1 us), then nothing.
pub fn mapPatches(file: File, reserve_bytes: u64) Error!WritableMemory {
    assert(reserve_bytes > 0);
    return backend.mapPatches(file.handle, reserve_bytes) catch |err| failFile(
        err,
        "map",
        file.dir_path,
        file.name(),
    );
}

/// Writes `bytes` at `offset` of `file` through `memory`, its `mapPatches`
/// mapping: as durable as a `write` (a sync of the file makes it so; the
/// kernel may write it back, page by page, any time before), and it cannot
/// fail. The bytes must lie inside the file as it is.
pub fn writePatch(file: File, memory: WritableMemory, bytes: []const u8, offset: u64) void {
    assert(offset + bytes.len <= memory.len);
    backend.writePatch(file.handle, memory, bytes, offset);
}

/// A hint only: a failure changes no result, so it is ignored.
pub fn advise(memory: []const u8, advice: Advice) void {
    if (memory.len == 0) return;
    const start = std.mem.alignBackward(usize, @intFromPtr(memory.ptr), page_size);
    const end = @intFromPtr(memory.ptr) + memory.len;
    const pointer: [*]align(page_size) const u8 = @ptrFromInt(start);
    backend.advise(pointer[0 .. end - start], advice);
}

/// Pages of a copy's source that one call can check and map: 8 MiB.
pub const populate_pages_max = 2048;

/// Maps every page of `memory` (a read-only file mapping, at most
/// `populate_pages_max` pages) into this process when the page cache holds
/// them all, so one copy from it takes no page faults; false when some are
/// not cached, or the kernel cannot (MADV_POPULATE_READ is Linux 5.14):
/// then a pread, whose readahead reads in large requests, is the faster
/// way. A hint: false never changes a result.
pub fn populateIfCached(memory: []const u8) bool {
    if (memory.len == 0) return true;
    const start = std.mem.alignBackward(usize, @intFromPtr(memory.ptr), page_size);
    const end = std.mem.alignForward(usize, @intFromPtr(memory.ptr) + memory.len, page_size);
    assert((end - start) / page_size <= populate_pages_max + 1);
    const pointer: [*]align(page_size) const u8 = @ptrFromInt(start);
    return backend.populateIfCached(pointer[0 .. end - start]);
}

/// The process id, for names of temporary files.
pub fn processId() i32 {
    return backend.processId();
}

/// This thread's involuntary context switches so far, null where not
/// counted: the worker pool's sign of a loaded machine (workers.zig). Not a
/// file-system call, so the simulator does not stand in for it.
pub fn preemptions() ?isize {
    if (builtin.os.tag != .linux) return null;
    return std.posix.getrusage(std.posix.rusage.THREAD).nivcsw;
}

// ---- the OS backend -----------------------------------------------------------

const Os = struct {
    fn dirOf(handle: i32) std.fs.Dir {
        return .{ .fd = handle };
    }

    fn fileOf(handle: i32) std.fs.File {
        return .{ .handle = handle };
    }

    fn openDir(path: []const u8) !i32 {
        const dir = try std.fs.cwd().openDir(path, .{ .iterate = true });
        return dir.fd;
    }

    fn makeDir(path: []const u8) !void {
        try std.fs.cwd().makeDir(path);
    }

    fn close(handle: i32) void {
        posix.close(handle);
    }

    fn syncDir(handle: i32) !void {
        try posix.fsync(handle);
    }

    fn exists(handle: i32, name: []const u8) bool {
        dirOf(handle).access(name, .{}) catch return false;
        return true;
    }

    fn link(handle: i32, old: []const u8, new: []const u8) !void {
        try posix.linkat(handle, old, handle, new, 0);
    }

    fn unlink(handle: i32, name: []const u8) !void {
        try dirOf(handle).deleteFile(name);
    }

    /// An open descriptor keeps the inode alive past the unlink, so the
    /// unlink only removes the name; the last close, on a detached thread,
    /// does the freeing.
    fn unlinkDeferred(handle: i32, name: []const u8) !void {
        const file = dirOf(handle).openFile(name, .{}) catch return Os.unlink(handle, name);
        dirOf(handle).deleteFile(name) catch |err| {
            file.close();
            return err;
        };
        const closer = std.Thread.spawn(
            .{ .stack_size = 64 << 10 },
            std.fs.File.close,
            .{file},
        ) catch {
            file.close();
            return;
        };
        closer.detach();
    }

    fn startWriteback(handle: i32, offset: u64, bytes: u64) void {
        const write_flag = 2; // SYNC_FILE_RANGE_WRITE
        // Only a hint: an error (an old kernel, a file system without it)
        // leaves the work to the sync that follows.
        _ = std.os.linux.syscall4(
            .sync_file_range,
            @bitCast(@as(isize, handle)),
            offset,
            bytes,
            write_flag,
        );
    }

    const Iterator = struct {
        inner: std.fs.Dir.Iterator,

        fn next(iterator: *@This()) !?[]const u8 {
            const entry = try iterator.inner.next() orelse return null;
            return entry.name;
        }
    };

    fn iterate(handle: i32) Os.Iterator {
        return .{ .inner = dirOf(handle).iterate() };
    }

    fn openFile(handle: i32, name: []const u8, writable: bool) !i32 {
        if (writable) {
            // The writer's own reads (a replace reads the blocks it
            // patches) set no access time: with relatime each read after
            // a write updated it, a journal handle of its own that waited
            // up to 9 ms on a jbd2 commit here. O_NOATIME needs the file's
            // owner (or CAP_FOWNER); anyone else opens without it.
            const fast = openAt(
                handle,
                name,
                .{ .ACCMODE = .RDWR, .CLOEXEC = true, .NOATIME = true },
            );
            if (fast) |fd| return fd else |err| if (err != error.PermissionDenied) return err;
        }
        return openAt(
            handle,
            name,
            .{ .ACCMODE = if (writable) .RDWR else .RDONLY, .CLOEXEC = true },
        );
    }

    fn createFile(handle: i32, name: []const u8, truncate: bool) !i32 {
        return openAt(
            handle,
            name,
            .{ .ACCMODE = .RDWR, .CREAT = true, .TRUNC = truncate, .CLOEXEC = true },
        );
    }

    /// openat(2) with every errno a store's files can meet named: std's
    /// own maps EROFS and EDQUOT to `error.Unexpected`, which would lose
    /// what the user must fix (a read-only place, a full quota).
    fn openAt(handle: i32, name: []const u8, flags: posix.O) !i32 {
        const name_z = try posix.toPosixPath(name);
        while (true) {
            const rc = std.os.linux.openat(handle, &name_z, flags, 0o666);
            // The raw syscall's result: posix.errno reads libc's errno instead.
            const signed: isize = @bitCast(rc);
            const code: u16 = if (signed > -4096 and signed < 0) @intCast(-signed) else 0;
            return switch (@as(posix.E, @enumFromInt(code))) {
                .SUCCESS => @intCast(rc),
                .INTR => continue,
                .ROFS => error.ReadOnlyFileSystem,
                .DQUOT => error.DiskQuota,
                .NOSPC => error.NoSpaceLeft,
                .ACCES => error.AccessDenied,
                .PERM => error.PermissionDenied,
                .NOENT => error.FileNotFound,
                .ISDIR => error.IsDir,
                .NOTDIR => error.NotDir,
                .EXIST => error.PathAlreadyExists,
                .NAMETOOLONG => error.NameTooLong,
                .LOOP => error.SymLinkLoop,
                .MFILE => error.ProcessFdQuotaExceeded,
                .NFILE => error.SystemFdQuotaExceeded,
                .NOMEM => error.SystemResources,
                .FBIG, .OVERFLOW => error.FileTooBig,
                .IO => error.InputOutput,
                else => |err| posix.unexpectedErrno(err),
            };
        }
    }

    fn pread(handle: i32, buffer: []u8, offset: u64) !usize {
        return fileOf(handle).preadAll(buffer, offset);
    }

    /// One `pread`: fewer bytes than asked where the file ends.
    fn preadOnce(handle: i32, buffer: []u8, offset: u64) !usize {
        return posix.pread(handle, buffer, offset);
    }

    fn identity(handle: i32) ![2]u64 {
        const stat = try posix.fstat(handle);
        return .{ @intCast(stat.dev), @intCast(stat.ino) };
    }

    fn pwrite(handle: i32, bytes: []const u8, offset: u64) !void {
        try fileOf(handle).pwriteAll(bytes, offset);
    }

    fn length(handle: i32) !u64 {
        return fileOf(handle).getEndPos();
    }

    fn setLength(handle: i32, bytes: u64) !void {
        try fileOf(handle).setEndPos(bytes);
    }

    fn syncFile(handle: i32) !void {
        try posix.fdatasync(handle);
    }

    fn tryLock(handle: i32) !bool {
        return fileOf(handle).tryLock(.exclusive);
    }

    fn map(handle: i32, reserve_bytes: u64) !Memory {
        const length_aligned = std.mem.alignForward(u64, reserve_bytes, page_size);
        return posix.mmap(null, length_aligned, posix.PROT.READ, .{ .TYPE = .SHARED }, handle, 0);
    }

    fn mapWritable(handle: i32, bytes: u64) !WritableMemory {
        const length_aligned = std.mem.alignForward(u64, bytes, page_size);
        return posix.mmap(
            null,
            length_aligned,
            posix.PROT.READ | posix.PROT.WRITE,
            .{ .TYPE = .SHARED },
            handle,
            0,
        );
    }

    fn mapPatches(handle: i32, reserve_bytes: u64) !WritableMemory {
        return Os.mapWritable(handle, reserve_bytes);
    }

    fn writePatch(handle: i32, memory: WritableMemory, bytes: []const u8, offset: u64) void {
        _ = handle;
        @memcpy(memory[offset..][0..bytes.len], bytes);
    }

    fn unmap(memory: Memory) void {
        posix.munmap(memory);
    }

    fn advise(memory: Memory, advice: Advice) void {
        const value: u32 = switch (advice) {
            .random => posix.MADV.RANDOM,
            .will_need => posix.MADV.WILLNEED,
            .huge_pages => posix.MADV.HUGEPAGE,
        };
        posix.madvise(@constCast(memory.ptr), memory.len, value) catch {};
    }

    fn populateIfCached(memory: Memory) bool {
        var resident: [populate_pages_max + 1]u8 = undefined;
        const pages = memory.len / page_size;
        posix.mincore(@constCast(memory.ptr), memory.len, &resident) catch return false;
        for (resident[0..pages]) |page| {
            if (page & 1 == 0) return false;
        }
        const populate_read = 22; // MADV_POPULATE_READ, not in Zig 0.15's std
        posix.madvise(@constCast(memory.ptr), memory.len, populate_read) catch return false;
        return true;
    }

    fn processId() i32 {
        return std.os.linux.getpid();
    }
};
