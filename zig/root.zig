//! The C ABI of libloaderx: thin `export` wrappers and nothing else. This
//! file is the full list of what Python can call; `src/loaderx/_abi.h`
//! declares the same functions for cffi. Logic lives in store.zig and
//! sampler.zig; errors map to status codes in status.zig.
const std = @import("std");
const status = @import("status.zig");

/// Bumped whenever the ABI or the on-disk format changes; `_native.py`
/// refuses a library whose version differs from the one it was written for.
pub const abi_version: u32 = 1;

export fn lx_version() u32 {
    return abi_version;
}

/// Copies the message of this thread's last failure (NUL-terminated, cut to
/// fit) and returns its full length.
export fn lx_error_message(target: [*]u8, capacity: usize) usize {
    const text = status.message();
    if (capacity > 0) {
        const copied = @min(text.len, capacity - 1);
        @memcpy(target[0..copied], text[0..copied]);
        target[copied] = 0;
    }
    return text.len;
}

fn result(outcome: status.Error!void) c_int {
    if (outcome) |_| {
        return 0;
    } else |err| {
        _ = status.failDefault(err, "{s}", .{@errorName(err)});
        return @intFromEnum(status.code(err));
    }
}

// ---- zrecord -------------------------------------------------------------

// ---- zsampler ------------------------------------------------------------

test {
    std.testing.refAllDecls(@This());
    _ = status;
}
