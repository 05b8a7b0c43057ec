test "placeholder" {}
