// Package api holds fence's protobuf definitions and the Go code generated
// from them. Run `go generate ./api/...` (needs protoc) after editing a .proto.
package api

//go:generate ../scripts/gen-proto.sh
