//! Byte shuffle by element size (the filter HDF5 and Blosc use): a record of
//! n elements of E bytes is stored as E planes of n bytes, byte j of every
//! element in plane j. Numeric data whose neighbouring elements share their
//! high bytes then gives zstd long runs to compress.
//!
//! Bytes past the last whole element (a record whose length is not a
//! multiple of E) stay where they are, after the planes.
//!
//! Both directions are a transpose of E x 16-byte blocks done with log2(E)
//! rounds of byte interleaves (punpcklbw/punpckhbw on x86), so they run at
//! several GB/s on any x86-64 level, far above zstd's decode speed.
const std = @import("std");
const assert = std.debug.assert;

const lanes = 16;
const Block = @Vector(lanes, u8);

/// Element sizes the filter supports.
pub fn supported(element_bytes: usize) bool {
    return element_bytes == 2 or element_bytes == 4 or element_bytes == 8;
}

/// Writes `source` shuffled by `element_bytes` into `target` (same length).
pub fn shuffle(element_bytes: usize, source: []const u8, target: []u8) void {
    switch (element_bytes) {
        2 => transpose(2, .shuffle, source, target),
        4 => transpose(4, .shuffle, source, target),
        8 => transpose(8, .shuffle, source, target),
        else => unreachable,
    }
}

/// Undoes `shuffle`: writes the elements of the planes in `source` into `target`.
pub fn unshuffle(element_bytes: usize, source: []const u8, target: []u8) void {
    switch (element_bytes) {
        2 => transpose(2, .unshuffle, source, target),
        4 => transpose(4, .unshuffle, source, target),
        8 => transpose(8, .unshuffle, source, target),
        else => unreachable,
    }
}

const Direction = enum { shuffle, unshuffle };

fn transpose(
    comptime E: usize,
    comptime direction: Direction,
    source: []const u8,
    target: []u8,
) void {
    assert(source.len == target.len);
    // The planes are read while elements are written: the buffers must not overlap.
    const source_start = @intFromPtr(source.ptr);
    const target_start = @intFromPtr(target.ptr);
    assert(
        source_start + source.len <= target_start or
            target_start + target.len <= source_start or
            source.len == 0,
    );
    const n = source.len / E;
    var i: usize = 0;
    while (i + lanes <= n) : (i += lanes) {
        var blocks: [E]Block = undefined;
        switch (direction) {
            .unshuffle => {
                inline for (0..E) |j| blocks[j] = source[j * n + i ..][0..lanes].*;
                interleave(E, &blocks);
                inline for (0..E) |j| target[i * E + j * lanes ..][0..lanes].* = blocks[j];
            },
            .shuffle => {
                inline for (0..E) |j| blocks[j] = source[i * E + j * lanes ..][0..lanes].*;
                deinterleave(E, &blocks);
                inline for (0..E) |j| target[j * n + i ..][0..lanes].* = blocks[j];
            },
        }
    }
    // The last elements that fill no whole block.
    while (i < n) : (i += 1) {
        inline for (0..E) |j| switch (direction) {
            .unshuffle => target[i * E + j] = source[j * n + i],
            .shuffle => target[j * n + i] = source[i * E + j],
        };
    }
    const whole = n * E;
    @memcpy(target[whole..], source[whole..]);
}

const low_mask = blk: {
    var mask: [lanes]i32 = undefined;
    for (0..lanes / 2) |k| {
        mask[2 * k] = k;
        mask[2 * k + 1] = ~@as(i32, k);
    }
    break :blk mask;
};
const high_mask = blk: {
    var mask: [lanes]i32 = undefined;
    for (0..lanes / 2) |k| {
        mask[2 * k] = lanes / 2 + k;
        mask[2 * k + 1] = ~@as(i32, lanes / 2 + k);
    }
    break :blk mask;
};
const even_mask = blk: {
    var mask: [lanes]i32 = undefined;
    for (0..lanes / 2) |k| {
        mask[k] = 2 * k;
        mask[lanes / 2 + k] = ~@as(i32, 2 * k);
    }
    break :blk mask;
};
const odd_mask = blk: {
    var mask: [lanes]i32 = undefined;
    for (0..lanes / 2) |k| {
        mask[k] = 2 * k + 1;
        mask[lanes / 2 + k] = ~@as(i32, 2 * k + 1);
    }
    break :blk mask;
};

/// E planes of 16 elements' bytes in, the 16 elements out (E blocks in
/// order): log2(E) rounds, each interleaving block j with block j + E/2.
fn interleave(comptime E: usize, blocks: *[E]Block) void {
    inline for (0..comptime std.math.log2_int(usize, E)) |_| {
        var next: [E]Block = undefined;
        inline for (0..E / 2) |j| {
            next[2 * j] = @shuffle(u8, blocks[j], blocks[j + E / 2], low_mask);
            next[2 * j + 1] = @shuffle(u8, blocks[j], blocks[j + E / 2], high_mask);
        }
        blocks.* = next;
    }
}

/// The inverse of `interleave`: each round splits consecutive blocks 2j and
/// 2j + 1 into their even bytes (block j) and odd bytes (block j + E/2).
fn deinterleave(comptime E: usize, blocks: *[E]Block) void {
    inline for (0..comptime std.math.log2_int(usize, E)) |_| {
        var next: [E]Block = undefined;
        inline for (0..E / 2) |j| {
            next[j] = @shuffle(u8, blocks[2 * j], blocks[2 * j + 1], even_mask);
            next[j + E / 2] = @shuffle(u8, blocks[2 * j], blocks[2 * j + 1], odd_mask);
        }
        blocks.* = next;
    }
}

fn referenceShuffle(element_bytes: usize, source: []const u8, target: []u8) void {
    const n = source.len / element_bytes;
    for (0..n) |i| for (0..element_bytes) |j| {
        target[j * n + i] = source[i * element_bytes + j];
    };
    @memcpy(target[n * element_bytes ..], source[n * element_bytes ..]);
}

test "shuffle matches the definition and unshuffle undoes it, at every length near a block edge" {
    var prng = std.Random.DefaultPrng.init(14);
    var source: [700]u8 = undefined;
    prng.random().bytes(&source);
    var expected: [700]u8 = undefined;
    var shuffled: [700]u8 = undefined;
    var restored: [700]u8 = undefined;
    for ([_]usize{ 2, 4, 8 }) |element_bytes| {
        for (0..source.len) |length| {
            referenceShuffle(element_bytes, source[0..length], expected[0..length]);
            shuffle(element_bytes, source[0..length], shuffled[0..length]);
            try std.testing.expectEqualSlices(u8, expected[0..length], shuffled[0..length]);
            unshuffle(element_bytes, shuffled[0..length], restored[0..length]);
            try std.testing.expectEqualSlices(u8, source[0..length], restored[0..length]);
        }
    }
}
