//! The superblock file: two slots, each holding one sealed `Superblock`;
//! open takes the newest sound slot.
//!
//! Invariant: the last synced generation is never overwritten. A commit
//! writes the slot that does not hold it; a durable commit syncs its slot
//! before it returns (and its slot then holds the last synced generation),
//! so a torn write falls back to the synced one. With durable=True every
//! commit is synced and the slots alternate. A durable=False store writes
//! its unsynced commits over each other in one slot, each naming its synced
//! base (`synced_base`), which open checks them against (store.zig). The file is created whole
//! (written and synced under a temporary name, then linked into place), so a
//! superblock file of any other length is damage zrecord did not make.
const std = @import("std");
const format = @import("format.zig");
const status = @import("status.zig");
const io = @import("io.zig");

const assert = std.debug.assert;
const Error = status.Error;
const Superblock = format.Superblock;

pub const file_name = "superblock";
/// A superblock being created is written under this prefix and the pid.
pub const temp_prefix = file_name ++ ".tmp-";

/// A superblock read from disk, and whether open fell back to the older slot
/// because the newer one is damaged (a commit torn by a crash).
pub const Loaded = struct {
    superblock: Superblock,
    fell_back: bool,
    /// The other slot when it is sound too (an unsynced head's base).
    older: ?Superblock = null,
    /// The other slot when it does not decode.
    unusable: ?Unusable = null,
};

/// A slot that does not decode, and what that can mean.
pub const Unusable = struct {
    slot: u1,
    /// What its checks found (format.zig), or "zeroed".
    reason: []const u8,
    kind: Kind,

    pub const Kind = enum {
        /// All zeros where no slot may ever have been written: slot 1 of a
        /// store whose slot 0 holds its first generation.
        blank,
        /// Fails its checks but starts with the magic: a write torn by a
        /// power loss leaves that (the old and the new bytes both start
        /// with it), and so does damage; the slot it tore never held the
        /// last synced generation.
        torn_or_damaged,
        /// Zeroed or without its magic although it held a superblock (the
        /// other slot's generation says so): no torn write leaves that.
        damaged,
    };
};

/// What the unusable slot `index` of `bytes` can be, given that the other
/// slot, `sound`, decodes.
fn classify(
    slot_bytes: *const [@sizeOf(Superblock)]u8,
    index: u1,
    reason: []const u8,
    sound: *const Superblock,
) Unusable {
    assert(sound.invalidReason() == null);
    assert(reason.len > 0);
    const zeroed = std.mem.allEqual(u8, slot_bytes, 0);
    // Slot 0 holds generation 0 from creation on; slot 1 is first written
    // by a commit, and slot 0 is overwritten only once slot 1 holds the
    // synced generation. So only slot 1 beside generation 0 in slot 0 may
    // never have been written.
    const maybe_never_written = index == 1 and sound.generation == 0;
    if (maybe_never_written) {
        return .{
            .slot = index,
            .reason = if (zeroed) "zeroed" else reason,
            .kind = if (zeroed) .blank else .torn_or_damaged,
        };
    }
    if (zeroed) return .{ .slot = index, .reason = "zeroed", .kind = .damaged };
    if (std.mem.eql(u8, reason, "wrong magic")) return .{
        .slot = index,
        .reason = reason,
        .kind = .damaged,
    };
    return .{ .slot = index, .reason = reason, .kind = .torn_or_damaged };
}

/// Reads the newest sound slot of the superblock of the store in `dir`.
pub fn read(dir: io.Dir) Error!Loaded {
    const file = io.openFile(dir, file_name, .read_only) catch |err| switch (err) {
        error.NotFound => return status.fail(
            error.NotAStore,
            "'{s}' has no superblock; it is not a zrecord store",
            .{dir.path},
        ),
        else => return err,
    };
    defer io.closeFile(file);
    const loaded = try readFile(dir, file);
    assert(loaded.superblock.invalidReason() == null);
    return loaded;
}

/// As `read`, through `file` (the superblock file, open): the writer's own
/// handle, so its refresh opens nothing.
pub fn readFile(dir: io.Dir, file: io.File) Error!Loaded {
    var bytes: [format.superblock_file_bytes + 1]u8 = undefined;
    const size = try io.read(file, &bytes, 0);
    assert(size <= bytes.len);
    if (size != format.superblock_file_bytes) {
        return status.fail(
            error.Corrupt,
            "store '{s}' is damaged: its superblock file holds {d} bytes, not {d} (zrecord " ++
                "never writes it partly); restore the store from a copy",
            .{ dir.path, size, format.superblock_file_bytes },
        );
    }
    var slots: [2]Superblock = undefined;
    var reasons: [2]?[]const u8 = undefined;
    for (&slots, &reasons, 0..) |*slot, *reason, index| {
        slot.* = std.mem.bytesToValue(
            Superblock,
            bytes[index * format.slot_bytes ..][0..@sizeOf(Superblock)],
        );
        reason.* = slot.invalidReason();
    }
    // A sound slot of another version means another loaderx wrote here:
    // reading the older slot would silently drop its commits.
    for (reasons) |reason| {
        if (reason != null and std.mem.eql(u8, reason.?, "unsupported version")) {
            return status.fail(
                error.UnsupportedVersion,
                "store '{s}' has an on-disk format version this loaderx cannot read (it reads " ++
                    "version {d}); upgrade loaderx",
                .{ dir.path, format.version },
            );
        }
    }
    if (reasons[0] == null and reasons[1] == null) {
        const newer: usize = if (slots[1].generation > slots[0].generation) 1 else 0;
        assert(slots[newer].generation >= slots[1 - newer].generation);
        return .{ .superblock = slots[newer], .fell_back = false, .older = slots[1 - newer] };
    }
    for (0..2) |index| {
        if (reasons[index] != null) continue;
        const other: u1 = @intCast(1 - index);
        const other_bytes = bytes[@as(u64, other) * format.slot_bytes ..][0..@sizeOf(Superblock)];
        const unusable = classify(other_bytes, other, reasons[other].?, &slots[index]);
        assert(unusable.slot == other);
        return .{
            .superblock = slots[index],
            .fell_back = unusable.kind != .blank,
            .unusable = unusable,
        };
    }
    if (std.mem.eql(u8, reasons[0].?, "wrong magic") and
        std.mem.eql(u8, reasons[1].?, "wrong magic"))
    {
        return status.fail(
            error.NotAStore,
            "'{s}' is not a zrecord store (its superblock has the wrong magic)",
            .{dir.path},
        );
    }
    return status.fail(
        error.Corrupt,
        "store '{s}' is damaged: both superblock slots are unusable ({s}; {s})",
        .{ dir.path, reasons[0].?, reasons[1].? },
    );
}

/// Creates the superblock of an empty store unless one exists. Written whole
/// under a temporary name and linked into place, so a crash never leaves a
/// half-written superblock; link fails if another process created the store
/// first, and then theirs stands. With `durable` false (a staged store,
/// which nobody opens until its owner renames it into place) nothing is
/// synced: `syncCreated` does that later, with the store's first commit.
pub fn create(dir: io.Dir, durable: bool) Error!void {
    var temp_buffer: [io.File.name_bytes_max]u8 = undefined;
    const temp = std.fmt.bufPrint(
        &temp_buffer,
        temp_prefix ++ "{d}",
        .{io.processId()},
    ) catch unreachable;
    const file = try io.createFile(dir, temp, true);
    defer io.unlink(dir, temp) catch {};
    defer io.closeFile(file);
    var superblock = Superblock.empty();
    superblock.seal();
    // The pair of `readFile`'s checks: what open takes as generation 0.
    assert(superblock.invalidReason() == null);
    assert(superblock.generation == 0);
    var slots = [_]u8{0} ** format.superblock_file_bytes;
    @memcpy(slots[0..@sizeOf(Superblock)], std.mem.asBytes(&superblock));
    try io.write(file, &slots, 0);
    if (durable) try io.sync(file);
    if (!try io.link(dir, temp, file_name)) return;
    if (!durable) return;
    try io.syncDir(dir);
    // The store's own entry in its parent must be durable too, whoever
    // created the directory.
    try io.syncParent(dir.path);
}

/// Makes a superblock that `create` wrote without syncing durable, with its
/// name in the store directory. The entry of the directory itself in its
/// parent is the owner's to sync.
pub fn syncCreated(dir: io.Dir) Error!void {
    const file = try io.openFile(dir, file_name, .read_only);
    defer io.closeFile(file);
    try io.sync(file);
    try io.syncDir(dir);
}

/// Writes `superblock` into `slot` and, when `durable`, makes it durable.
/// On failure the slot is put back as it was, as far as the disk allows,
/// and the caller must treat the commit as not made.
pub fn write(
    file: io.File,
    superblock: *const Superblock,
    overwritten: *const Superblock,
    slot: u1,
    durable: bool,
) Error!void {
    // The writer's side of `readFile`'s checks: a sealed superblock that
    // decodes, past generation 0 (which `create` alone writes), in a slot
    // within the file.
    assert(superblock.invalidReason() == null);
    assert(superblock.generation > 0);
    const offset = @as(u64, slot) * format.slot_bytes;
    assert(offset + @sizeOf(Superblock) <= format.superblock_file_bytes);
    const outcome = blk: {
        io.write(file, std.mem.asBytes(superblock), offset) catch |err| break :blk err;
        if (durable) io.sync(file) catch |err| break :blk err;
        return;
    };
    // The slot may hold the new generation in the page cache: undo that so
    // no reader takes a commit that failed. The message of the first failure
    // stands; the undo's own failure changes nothing more.
    var saved: [512]u8 = undefined;
    const message = status.message();
    const kept = message[0..@min(message.len, saved.len)];
    @memcpy(saved[0..kept.len], kept);
    io.write(file, std.mem.asBytes(overwritten), offset) catch {};
    return status.fail(outcome, "{s}; the commit was not made", .{saved[0..kept.len]});
}
