//! One error set for everything the C ABI can report, mapped exhaustively to
//! the status codes that `src/loaderx/_native.py` turns into exceptions, and
//! the per-thread message that says what exactly went wrong.
const std = @import("std");

/// Every failure the core reports to Python. Programmer errors inside the
/// core are assertions, not members of this set.
pub const Error = error{
    InvalidArgument,
    IndexOutOfRange,
    Io,
    Corrupt,
    ChecksumMismatch,
    Locked,
    ReadOnly,
    NoSpace,
    OutOfMemory,
    NotAStore,
    UnsupportedVersion,
    Codec,
    NoDictionary,
    TooLarge,
    DictionaryExists,
    BufferTooSmall,
    NotFound,
};

/// Status codes of the C ABI. The numbers are part of the ABI: append only.
pub const Code = enum(c_int) {
    ok = 0,
    invalid_argument = 1,
    index_out_of_range = 2,
    io = 3,
    corrupt = 4,
    checksum_mismatch = 5,
    locked = 6,
    read_only = 7,
    no_space = 8,
    out_of_memory = 9,
    not_a_store = 10,
    unsupported_version = 11,
    codec = 12,
    no_dictionary = 13,
    too_large = 14,
    dictionary_exists = 15,
    buffer_too_small = 16,
    not_found = 17,
};

/// `Code.ok` as the C ABI returns it, for the exports that succeed without
/// going through an error union.
pub const ok: c_int = @intFromEnum(Code.ok);

pub fn code(err: Error) Code {
    return switch (err) {
        error.InvalidArgument => .invalid_argument,
        error.IndexOutOfRange => .index_out_of_range,
        error.Io => .io,
        error.Corrupt => .corrupt,
        error.ChecksumMismatch => .checksum_mismatch,
        error.Locked => .locked,
        error.ReadOnly => .read_only,
        error.NoSpace => .no_space,
        error.OutOfMemory => .out_of_memory,
        error.NotAStore => .not_a_store,
        error.UnsupportedVersion => .unsupported_version,
        error.Codec => .codec,
        error.NoDictionary => .no_dictionary,
        error.TooLarge => .too_large,
        error.DictionaryExists => .dictionary_exists,
        error.BufferTooSmall => .buffer_too_small,
        error.NotFound => .not_found,
    };
}

const message_bytes_max = 512;
threadlocal var message_buffer: [message_bytes_max]u8 = undefined;
threadlocal var message_len: usize = 0;
/// The errno of the OS failure behind this thread's last failure (0: none),
/// for Python's OSError classes.
threadlocal var os_errno: i32 = 0;

/// Records the message of the failure about to be returned on this thread.
/// Several worker threads may fail at once; each caller thread keeps its own.
pub fn fail(err: Error, comptime format: []const u8, args: anytype) Error {
    const written = std.fmt.bufPrint(&message_buffer, format, args) catch blk: {
        // Truncated messages still say most of what went wrong.
        break :blk message_buffer[0..];
    };
    message_len = written.len;
    return err;
}

/// Puts what the caller was doing in front of the message of `err`, which
/// must have been set by the failure being returned.
pub fn wrap(err: Error, comptime format: []const u8, args: anytype) Error {
    var saved: [message_bytes_max]u8 = undefined;
    const previous = saved[0..message_len];
    @memcpy(previous, message_buffer[0..message_len]);
    return fail(err, format ++ ": {s}", args ++ .{previous});
}

/// Sets the message only if none was set since the last `clear`.
pub fn failDefault(err: Error, comptime format: []const u8, args: anytype) void {
    if (message_len == 0) {
        const same = fail(err, format, args);
        std.debug.assert(same == err);
    }
}

/// A failure's message and errno, kept while cleanup that may fail itself runs.
pub const Saved = struct {
    err: Error,
    text: [message_bytes_max]u8 = undefined,
    len: usize = 0,
    errno_value: i32 = 0,
};

pub fn save(err: Error) Saved {
    var saved = Saved{ .err = err, .len = message_len, .errno_value = os_errno };
    @memcpy(saved.text[0..message_len], message_buffer[0..message_len]);
    return saved;
}

/// Puts back what `save` kept: the failure being returned stays the one
/// reported, whatever the cleanup since reported.
pub fn restore(saved: *const Saved) void {
    const same = fail(saved.err, "{s}", .{saved.text[0..saved.len]});
    std.debug.assert(same == saved.err);
    os_errno = saved.errno_value;
}

pub fn clear() void {
    message_len = 0;
    os_errno = 0;
}

/// The errno of the OS failure behind the last failure, or 0.
pub fn osErrno() i32 {
    return os_errno;
}

pub fn message() []const u8 {
    return message_buffer[0..message_len];
}

/// Maps an OS error from std.fs / std.posix to our set, with a message;
/// `errno` is the errno it stands for (io.zig's `errnoOf`).
pub fn fromOs(err: anyerror, errno: i32, comptime what: []const u8, args: anytype) Error {
    const kind: Error = switch (err) {
        error.NoSpaceLeft, error.DiskQuota, error.FileTooBig => error.NoSpace,
        error.AccessDenied, error.PermissionDenied, error.ReadOnlyFileSystem => error.ReadOnly,
        error.FileNotFound => error.NotFound,
        error.OutOfMemory, error.SystemResources => error.OutOfMemory,
        else => error.Io,
    };
    const hint = switch (kind) {
        error.NoSpace => " (out of disk space or over a size limit): free some space and retry; " ++
            "committed records are intact",
        error.ReadOnly => " (permission denied or read-only file system)",
        else => if (err == error.NameTooLong) " (a name in the path is longer than the file " ++
            "system allows): give a shorter path" else "",
    };
    const failure = fail(kind, what ++ ": {s}{s}", args ++ .{ @errorName(err), hint });
    os_errno = errno;
    return failure;
}

test "every error maps to a distinct status code" {
    const errors = @typeInfo(Error).error_set.?;
    var seen = std.StaticBitSet(64).initEmpty();
    inline for (errors) |e| {
        const value: usize = @intCast(@intFromEnum(code(@field(anyerror, e.name))));
        try std.testing.expect(value != 0);
        try std.testing.expect(!seen.isSet(value));
        seen.set(value);
    }
    try std.testing.expectEqual(@as(usize, errors.len), seen.count());
}
