package check

// FenceBinary is the fence command that TestMain (check_test.go) builds,
// for this package's tests that start nodes as processes, inside the
// package and out.
var FenceBinary string
