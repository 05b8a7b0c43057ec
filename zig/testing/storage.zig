//! A simulated disk for the store's tests: the backend of `io.zig` in the
//! Zig test binary. Files and directories live in memory, and each keeps
//! what is durable apart from what is merely visible:
//!
//!   - a write or a truncation is pending until its file is synced;
//!   - a create, link or unlink (and a new directory) is pending until the
//!     directory that holds the name is synced;
//!   - `powerLoss(seed)` keeps, drops or tears (file writes, at 512-byte
//!     sectors) each pending operation independently, in order, and the
//!     result becomes the new durable and visible state;
//!   - a sync that fails drops the file's pending writes from what can become
//!     durable: they stay visible, as the kernel's clean-marked pages do, and
//!     a later sync that "succeeds" does not save them (PostgreSQL, 2018).
//!
//! Calls are counted; a test can lose power at the n-th call (that call and
//! every later one fail, as if the machine stopped) or fail the n-th call of
//! one kind with EIO, ENOSPC, a short write or a failed sync.
//!
//! One disk per process, guarded by a mutex (a store's gather workers read
//! through it too). Mappings point into a file's visible buffer, which never
//! moves, so a mapping sees what the file holds, as a shared mapping does.
const std = @import("std");

const assert = std.debug.assert;
const page_size = std.heap.page_size_min;
const Memory = []align(page_size) const u8;
const backing = std.heap.c_allocator;

/// Files are small in tests; a write past this fails like a full disk. The
/// buffer is reserved, not touched, so unused capacity costs no memory.
pub const file_bytes_max: u64 = 16 << 20;
pub const sector_bytes: u64 = 512;

pub const Kind = enum {
    open,
    create,
    read,
    write,
    length,
    set_length,
    sync_file,
    sync_dir,
    make_dir,
    link,
    unlink,
    list,
    lock,
    map,
    /// A store through a `mapPatches` mapping: it cannot fail, but power
    /// can go before it.
    patch,
};
pub const Fault = enum { eio, enospc, short_write, sync_fails };

const Pending = struct {
    offset: u64,
    /// null: a truncation to `offset`.
    bytes: ?[]u8,
};

const DirOp = struct {
    name: []u8,
    /// null: the name is removed.
    node: ?u32,
};

const Names = std.StringArrayHashMapUnmanaged(u32);

const Node = struct {
    is_dir: bool,
    // Files.
    visible: []align(page_size) u8 = &.{},
    visible_bytes: u64 = 0,
    durable: std.ArrayList(u8) = .empty,
    pending: std.ArrayList(Pending) = .empty,
    lock_holder: ?i32 = null,
    /// Mapped writable (the lock file's shared page): the kernel may write
    /// its dirty page back at any time, so a power loss may keep what the
    /// mapping holds, though nothing syncs it.
    mapped_writable: bool = false,
    // Directories.
    names: Names = .empty,
    durable_names: Names = .empty,
    dir_pending: std.ArrayList(DirOp) = .empty,
};

const Handle = struct { node: u32, writable: bool };

/// File buffers of earlier runs, zeroed, for the next ones: a run makes
/// dozens of files, and thousands of runs should not map and unmap each.
var spare_buffers: std.ArrayList([]align(page_size) u8) = .empty;

const Disk = struct {
    mutex: std.Thread.Mutex = .{},
    arena: std.heap.ArenaAllocator = .init(backing),
    nodes: std.ArrayList(Node) = .empty,
    handles: std.ArrayList(?Handle) = .empty,
    calls: u64 = 0,
    kind_calls: [std.enums.values(Kind).len]u64 = @splat(0),
    power_off_at: ?u64 = null,
    powered_off: bool = false,
    fault: ?struct { kind: Kind, at: u64, fault: Fault } = null,
    fault_fired: bool = false,
    /// The write-back hints given since the last reset: how many, and the
    /// end of the last range.
    writeback: Writeback = .{},
    /// Bytes that reads returned since the last reset.
    read_bytes: u64 = 0,
};

pub const Writeback = struct { calls: u64 = 0, end: u64 = 0 };

var disk: Disk = .{};

/// Prints every counted call (for replaying one failing trial by hand).
pub var trace = false;

// ---- the test's controls -----------------------------------------------------

/// Forgets every file and directory: a fresh, empty disk. Called between
/// runs, when no store and no other thread uses the disk.
pub fn reset() void {
    for (disk.nodes.items) |*node| {
        if (node.visible.len > 0) {
            @memset(node.visible[0..node.visible_bytes], 0);
            spare_buffers.append(backing, node.visible) catch std.heap.page_allocator.free(
                node.visible,
            );
        }
        node.durable.deinit(backing);
        node.pending.deinit(backing);
        node.names.deinit(backing);
        node.durable_names.deinit(backing);
        node.dir_pending.deinit(backing);
    }
    // Keep the arena's and lists' memory: thousands of runs would otherwise
    // fault the same pages in again and again.
    disk.nodes.clearRetainingCapacity();
    disk.handles.clearRetainingCapacity();
    _ = disk.arena.reset(.retain_capacity);
    disk.calls = 0;
    disk.kind_calls = @splat(0);
    disk.power_off_at = null;
    disk.powered_off = false;
    disk.fault = null;
    disk.fault_fired = false;
    disk.writeback = .{};
    disk.read_bytes = 0;
}

/// The number of counted calls since the last reset or power loss.
pub fn callCount() u64 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.calls;
}

/// Loses power just before counted call `call` (0-based) runs.
pub fn powerOffAt(call: ?u64) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    disk.power_off_at = call;
}

pub fn poweredOff() bool {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.powered_off;
}

/// Fails call `at` (0-based, counted per kind) of `kind` with `fault`.
pub fn injectFault(kind: Kind, at: u64, fault: Fault) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    disk.fault = .{ .kind = kind, .at = at, .fault = fault };
    disk.fault_fired = false;
}

/// Whether the fault fired (it stays set).
pub fn faultFired() bool {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.fault_fired;
}

/// Clears the fault; returns whether it fired.
pub fn clearFault() bool {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    disk.fault = null;
    return disk.fault_fired;
}

/// The handles open now (a failed open must leave none behind).
pub fn openHandles() usize {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    var count: usize = 0;
    for (disk.handles.items) |entry| count += @intFromBool(entry != null);
    return count;
}

pub fn kindCount(kind: Kind) u64 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.kind_calls[@intFromEnum(kind)];
}

/// The process dies (SIGKILL) but the machine stays up: everything written
/// stays, as the page cache keeps it, including writes through shared
/// mappings; every handle (and every lock) is gone.
pub fn processCrash() void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    for (disk.nodes.items) |*node| {
        if (node.is_dir) continue;
        node.lock_holder = null;
    }
    disk.handles.clearRetainingCapacity();
    disk.calls = 0;
    disk.kind_calls = @splat(0);
    disk.power_off_at = null;
    disk.powered_off = false;
    disk.fault = null;
}

/// Power is lost and comes back: every pending operation is kept, dropped or
/// torn by `seed`, every handle is gone, and what is left is durable.
/// The caller must have abandoned every handle and mapping of the old run.
pub fn powerLoss(seed: u64) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    var prng = std.Random.DefaultPrng.init(seed);
    const random = prng.random();
    for (disk.nodes.items) |*node| {
        if (node.is_dir) {
            settleDir(node, random);
        } else {
            settleFile(node, random);
        }
    }
    disk.handles.clearRetainingCapacity();
    disk.calls = 0;
    disk.kind_calls = @splat(0);
    disk.power_off_at = null;
    disk.powered_off = false;
    disk.fault = null;
}

fn settleFile(node: *Node, random: std.Random) void {
    if (node.mapped_writable and random.boolean()) {
        // Written back whole just before the power went.
        node.durable.resize(backing, node.visible_bytes) catch @panic("out of memory");
        @memcpy(node.durable.items, node.visible[0..node.visible_bytes]);
        node.pending.clearRetainingCapacity();
    }
    for (node.pending.items) |op| {
        switch (random.uintLessThan(u8, 3)) {
            0 => {}, // dropped
            1 => applyWrite(&node.durable, op, null),
            else => applyWrite(&node.durable, op, random), // torn
        }
    }
    node.pending.clearRetainingCapacity();
    node.lock_holder = null;
    @memcpy(node.visible[0..node.durable.items.len], node.durable.items);
    @memset(
        node.visible[node.durable.items.len..@max(node.visible_bytes, node.durable.items.len)],
        0,
    );
    node.visible_bytes = node.durable.items.len;
}

/// Applies a pending write to `content`; with `tear`, each sector it covers
/// is kept or left as it was (zeros past the old end).
fn applyWrite(content: *std.ArrayList(u8), op: Pending, tear: ?std.Random) void {
    const bytes = op.bytes orelse {
        content.resize(backing, op.offset) catch @panic("out of memory");
        return;
    };
    const end = op.offset + bytes.len;
    const old_len = content.items.len;
    if (end > old_len) {
        content.resize(backing, end) catch @panic("out of memory");
        @memset(content.items[old_len..end], 0);
    }
    var sector_start = op.offset;
    while (sector_start < end) {
        const sector_end = @min(end, (sector_start / sector_bytes + 1) * sector_bytes);
        const kept = if (tear) |random| random.boolean() else true;
        if (kept) @memcpy(
            content.items[sector_start..sector_end],
            bytes[sector_start - op.offset .. sector_end - op.offset],
        );
        sector_start = sector_end;
    }
}

fn settleDir(node: *Node, random: std.Random) void {
    node.names.deinit(backing);
    node.names = node.durable_names.clone(backing) catch @panic("out of memory");
    for (node.dir_pending.items) |op| {
        if (random.boolean()) continue;
        applyDirOp(&node.names, op);
    }
    node.dir_pending.clearRetainingCapacity();
    node.durable_names.deinit(backing);
    node.durable_names = node.names.clone(backing) catch @panic("out of memory");
}

fn applyDirOp(names: *Names, op: DirOp) void {
    if (op.node) |target| {
        names.put(backing, op.name, target) catch @panic("out of memory");
    } else {
        _ = names.orderedRemove(op.name);
    }
}

/// The names in directory `path`, visible now (for orphan checks).
pub fn listNames(
    path: []const u8,
    out: *std.ArrayList([]const u8),
    allocator: std.mem.Allocator,
) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    const id = try resolve(path);
    for (disk.nodes.items[id].names.keys()) |name| try out.append(allocator, name);
}

// ---- call accounting ---------------------------------------------------------

const CallError = error{ InputOutput, NoSpaceLeft };

/// Counts a call and decides whether it runs. Returns the fault to act out,
/// if the caller must act one out itself (short write, failed sync).
fn enter(kind: Kind) CallError!?Fault {
    if (disk.nodes.items.len == 0) {
        const root = newNode(true) catch @panic("out of memory");
        assert(root == 0);
    }
    if (disk.powered_off) return error.InputOutput;
    if (disk.power_off_at) |at| {
        if (disk.calls == at) {
            disk.powered_off = true;
            return error.InputOutput;
        }
    }
    if (trace) std.debug.print("call {d}: {s}\n", .{ disk.calls, @tagName(kind) });
    disk.calls += 1;
    const index = @intFromEnum(kind);
    defer disk.kind_calls[index] += 1;
    const fault = disk.fault orelse return null;
    if (fault.kind != kind or fault.at != disk.kind_calls[index]) return null;
    disk.fault_fired = true;
    return switch (fault.fault) {
        .eio => error.InputOutput,
        .enospc => error.NoSpaceLeft,
        .short_write, .sync_fails => fault.fault,
    };
}

// ---- nodes and paths -----------------------------------------------------------

fn newNode(is_dir: bool) !u32 {
    var node = Node{ .is_dir = is_dir };
    if (!is_dir) {
        node.visible = spare_buffers.pop() orelse try std.heap.page_allocator.alignedAlloc(
            u8,
            .fromByteUnits(page_size),
            file_bytes_max,
        );
    }
    try disk.nodes.append(backing, node);
    return @intCast(disk.nodes.items.len - 1);
}

fn keep(name: []const u8) ![]u8 {
    return disk.arena.allocator().dupe(u8, name);
}

/// Walks `path` from the root (relative paths start there too).
fn resolve(path: []const u8) !u32 {
    var id: u32 = 0;
    var parts = std.mem.tokenizeScalar(u8, path, '/');
    while (parts.next()) |part| {
        if (std.mem.eql(u8, part, ".")) continue;
        const node = &disk.nodes.items[id];
        if (!node.is_dir) return error.NotDir;
        id = node.names.get(part) orelse return error.FileNotFound;
    }
    return id;
}

fn handleNode(handle: i32) *Node {
    const entry = disk.handles.items[@intCast(handle)].?;
    return &disk.nodes.items[entry.node];
}

fn newHandle(node: u32, writable: bool) !i32 {
    try disk.handles.append(backing, .{ .node = node, .writable = writable });
    return @intCast(disk.handles.items.len - 1);
}

fn addName(dir: *Node, name: []const u8, node: ?u32) !void {
    const owned = try keep(name);
    const op = DirOp{ .name = owned, .node = node };
    applyDirOp(&dir.names, op);
    try dir.dir_pending.append(backing, op);
}

// ---- the backend interface of io.zig ---------------------------------------------

pub fn openDir(path: []const u8) !i32 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.open);
    const id = try resolve(path);
    if (!disk.nodes.items[id].is_dir) return error.NotDir;
    return newHandle(id, false);
}

pub fn makeDir(path: []const u8) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.make_dir);
    const parent_path = std.fs.path.dirname(path) orelse "";
    const parent = try resolve(parent_path);
    const name = std.fs.path.basename(path);
    if (disk.nodes.items[parent].names.contains(name)) return error.PathAlreadyExists;
    const id = try newNode(true);
    try addName(&disk.nodes.items[parent], name, id);
}

pub fn close(handle: i32) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    // Handles of a run cut short by a power loss are gone already.
    if (handle < 0 or handle >= disk.handles.items.len) return;
    const entry = disk.handles.items[@intCast(handle)] orelse return;
    const node = &disk.nodes.items[entry.node];
    if (node.lock_holder == handle) node.lock_holder = null;
    disk.handles.items[@intCast(handle)] = null;
}

pub fn syncDir(handle: i32) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    const fault = try enter(.sync_dir);
    const node = handleNode(handle);
    // A failed sync leaves the names visible but never durable.
    if (fault != .sync_fails) {
        for (node.dir_pending.items) |op| applyDirOp(&node.durable_names, op);
    }
    node.dir_pending.clearRetainingCapacity();
    if (fault == .sync_fails) return error.InputOutput;
    node.dir_pending.clearRetainingCapacity();
}

pub fn exists(handle: i32, name: []const u8) bool {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    if (disk.powered_off) return false;
    return handleNode(handle).names.contains(name);
}

pub fn link(handle: i32, old: []const u8, new: []const u8) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.link);
    if (trace) std.debug.print("  {s} -> {s}\n", .{ old, new });
    const dir = handleNode(handle);
    const target = dir.names.get(old) orelse return error.FileNotFound;
    if (dir.names.contains(new)) return error.PathAlreadyExists;
    try addName(dir, new, target);
}

pub fn unlink(handle: i32, name: []const u8) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.unlink);
    if (trace) std.debug.print("  {s}\n", .{name});
    const dir = handleNode(handle);
    if (!dir.names.contains(name)) return error.FileNotFound;
    try addName(dir, name, null);
}

/// The simulated disk frees nothing: deferring is the same as unlinking.
pub fn unlinkDeferred(handle: i32, name: []const u8) !void {
    return unlink(handle, name);
}

/// A hint with no effect on what is durable: not a counted call, only
/// tallied. A hint must name bytes the file already holds.
pub fn startWriteback(handle: i32, offset: u64, bytes: u64) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    assert(offset + bytes <= handleNode(handle).visible_bytes);
    disk.writeback = .{ .calls = disk.writeback.calls + 1, .end = offset + bytes };
}

pub fn readBytes() u64 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.read_bytes;
}

pub fn writebackStarted() Writeback {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return disk.writeback;
}

pub const Iterator = struct {
    node: u32,
    index: usize = 0,

    pub fn next(iterator: *Iterator) !?[]const u8 {
        disk.mutex.lock();
        defer disk.mutex.unlock();
        if (iterator.index == 0) _ = try enter(.list);
        const names = disk.nodes.items[iterator.node].names.keys();
        if (iterator.index >= names.len) return null;
        iterator.index += 1;
        return names[iterator.index - 1];
    }
};

pub fn iterate(handle: i32) Iterator {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    return .{ .node = disk.handles.items[@intCast(handle)].?.node };
}

pub fn openFile(handle: i32, name: []const u8, writable: bool) !i32 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.open);
    if (trace) std.debug.print("  {s}\n", .{name});
    const id = handleNode(handle).names.get(name) orelse return error.FileNotFound;
    if (disk.nodes.items[id].is_dir) return error.IsDir;
    return newHandle(id, writable);
}

pub fn createFile(handle: i32, name: []const u8, truncate: bool) !i32 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.create);
    if (trace) std.debug.print("  {s} (node {d} if new)\n", .{ name, disk.nodes.items.len });
    const dir = handleNode(handle);
    if (dir.names.get(name)) |id| {
        if (disk.nodes.items[id].is_dir) return error.IsDir;
        if (truncate) try setLengthLocked(&disk.nodes.items[id], 0);
        return newHandle(id, true);
    }
    const id = try newNode(false);
    // `newNode` may have moved the node list: look the directory up again.
    try addName(handleNode(handle), name, id);
    return newHandle(id, true);
}

pub fn pread(handle: i32, buffer: []u8, offset: u64) !usize {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.read);
    const node = handleNode(handle);
    if (offset >= node.visible_bytes) return 0;
    const count = @min(buffer.len, node.visible_bytes - offset);
    @memcpy(buffer[0..count], node.visible[offset..][0..count]);
    disk.read_bytes += count;
    return count;
}

/// `pread` reads by one call here already.
pub const preadOnce = pread;

/// A directory's node number, as an inode (the device is 0).
pub fn identity(handle: i32) ![2]u64 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.length); // an fstat, as a length is
    return .{ 0, disk.handles.items[@intCast(handle)].?.node };
}

pub fn pwrite(handle: i32, bytes: []const u8, offset: u64) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    const fault = try enter(.write);
    if (trace) std.debug.print(
        "  node {d} at {d}, {d} bytes\n",
        .{ disk.handles.items[@intCast(handle)].?.node, offset, bytes.len },
    );
    assert(disk.handles.items[@intCast(handle)].?.writable);
    const node = handleNode(handle);
    const written = if (fault == .short_write) bytes[0 .. bytes.len / 2] else bytes;
    if (offset + written.len > file_bytes_max) return error.FileTooBig;
    if (written.len > 0) {
        @memcpy(node.visible[offset..][0..written.len], written);
        node.visible_bytes = @max(node.visible_bytes, offset + written.len);
        try node.pending.append(
            backing,
            .{ .offset = offset, .bytes = try disk.arena.allocator().dupe(u8, written) },
        );
    }
    if (fault == .short_write) return error.NoSpaceLeft;
}

pub fn length(handle: i32) !u64 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.length);
    return handleNode(handle).visible_bytes;
}

pub fn setLength(handle: i32, bytes: u64) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.set_length);
    if (trace) std.debug.print(
        "  node {d} to {d}\n",
        .{ disk.handles.items[@intCast(handle)].?.node, bytes },
    );
    try setLengthLocked(handleNode(handle), bytes);
}

fn setLengthLocked(node: *Node, bytes: u64) !void {
    if (bytes > file_bytes_max) return error.FileTooBig;
    if (bytes < node.visible_bytes) @memset(node.visible[bytes..node.visible_bytes], 0);
    node.visible_bytes = bytes;
    try node.pending.append(backing, .{ .offset = bytes, .bytes = null });
}

pub fn syncFile(handle: i32) !void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    const fault = try enter(.sync_file);
    if (trace) std.debug.print("  node {d}\n", .{disk.handles.items[@intCast(handle)].?.node});
    const node = handleNode(handle);
    // A failed sync leaves the writes visible but never durable.
    if (fault != .sync_fails) {
        for (node.pending.items) |op| applyWrite(&node.durable, op, null);
    }
    node.pending.clearRetainingCapacity();
    if (fault == .sync_fails) return error.InputOutput;
}

pub fn tryLock(handle: i32) !bool {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.lock);
    const node = handleNode(handle);
    if (node.lock_holder) |holder| {
        if (holder != handle and disk.handles.items[@intCast(holder)] != null) return false;
    }
    node.lock_holder = handle;
    return true;
}

pub fn map(handle: i32, reserve_bytes: u64) !Memory {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = reserve_bytes;
    _ = try enter(.map);
    return handleNode(handle).visible;
}

/// A writable shared mapping is the visible buffer itself; what is written
/// through it becomes durable only if a power loss keeps the file's visible
/// bytes whole (only the lock file's volatile page uses it).
pub fn mapWritable(handle: i32, bytes: u64) ![]align(page_size) u8 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = try enter(.map);
    const node = handleNode(handle);
    assert(disk.handles.items[@intCast(handle)].?.writable);
    if (node.visible_bytes < bytes) return error.InputOutput;
    node.mapped_writable = true;
    return node.visible;
}

/// A mapping for in-place patches is the visible buffer itself, as `map`'s.
pub fn mapPatches(handle: i32, reserve_bytes: u64) ![]align(page_size) u8 {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = reserve_bytes;
    _ = try enter(.map);
    assert(disk.handles.items[@intCast(handle)].?.writable);
    return handleNode(handle).visible;
}

/// A store through a patch mapping: pending like a write (kept, dropped
/// or torn by a power loss, durable at the file's next sync), since the
/// kernel writes a dirty page back when it likes and a sync writes them
/// all. Power gone before it: it never happened (the machine stopped).
pub fn writePatch(handle: i32, memory: []align(page_size) u8, bytes: []const u8, offset: u64) void {
    disk.mutex.lock();
    defer disk.mutex.unlock();
    _ = enter(.patch) catch return;
    const node = handleNode(handle);
    assert(memory.ptr == node.visible.ptr);
    // Past the file's end a real mapping raises SIGBUS.
    assert(offset + bytes.len <= node.visible_bytes);
    if (trace) std.debug.print(
        "  node {d} at {d}, {d} bytes\n",
        .{ disk.handles.items[@intCast(handle)].?.node, offset, bytes.len },
    );
    if (bytes.len == 0) return;
    @memcpy(node.visible[offset..][0..bytes.len], bytes);
    const copy = disk.arena.allocator().dupe(u8, bytes) catch @panic("out of memory");
    node.pending.append(backing, .{ .offset = offset, .bytes = copy }) catch
        @panic("out of memory");
}

pub fn unmap(memory: Memory) void {
    _ = memory;
}

pub fn advise(memory: Memory, advice: anytype) void {
    _ = memory;
    _ = advice;
}

/// The simulated disk has no page cache to ask: copies take the pread
/// path, whose faults the simulation can inject.
pub fn populateIfCached(memory: Memory) bool {
    _ = memory;
    return false;
}

pub fn processId() i32 {
    return 4242;
}
