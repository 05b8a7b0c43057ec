//! Builds the loaderx native core: one shared library (`libloaderx.so`) that
//! the Python package loads with cffi, and the Zig unit tests.
//!
//!   zig build -Dzstd=/usr/lib/x86_64-linux-gnu/libzstd.so.1 \
//!       -Dlz4=/usr/lib/x86_64-linux-gnu/liblz4.so.1                   library
//!   zig build test -Dzstd=... -Dlz4=...                               tests
//!
//! libzstd and liblz4 are the system's shared objects, linked by path: no
//! headers, no `-dev` package, no vendored sources. `zig/clib.zig` declares
//! the functions.
const std = @import("std");

pub fn build(b: *std.Build) void {
    const target = b.standardTargetOptions(.{});
    const optimize = b.option(
        std.builtin.OptimizeMode,
        "optimize",
        "Optimization mode (default ReleaseFast)",
    ) orelse .ReleaseFast;
    const zstd_path = b.option(
        []const u8,
        "zstd",
        "Path of the system libzstd.so.1",
    ) orelse "/usr/lib/x86_64-linux-gnu/libzstd.so.1";
    const lz4_path = b.option(
        []const u8,
        "lz4",
        "Path of the system liblz4.so.1",
    ) orelse "/usr/lib/x86_64-linux-gnu/liblz4.so.1";
    // Wheels ship stripped: the debug info is most of the library's size.
    const strip = b.option(bool, "strip", "Strip debug info and symbols (default false)");

    const module = b.createModule(.{
        .root_source_file = b.path("zig/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
        .strip = strip,
    });
    module.addObjectFile(.{ .cwd_relative = zstd_path });
    module.addObjectFile(.{ .cwd_relative = lz4_path });

    const library = b.addLibrary(.{
        .name = "loaderx",
        .linkage = .dynamic,
        .root_module = module,
    });
    b.installArtifact(library);

    const tests = b.addTest(.{ .root_module = module });
    const run_tests = b.addRunArtifact(tests);
    const test_step = b.step("test", "Run the Zig unit tests");
    test_step.dependOn(&run_tests.step);
}
