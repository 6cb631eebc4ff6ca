package server

import (
	"encoding/binary"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// A follower keeps stale reads, in any of the API's encodings, and
// forwards the rest.
func TestStaleReadIsRecognised(t *testing.T) {
	bin, err := proto.Marshal(&fencev1.GetRequest{Key: "k", Stale: true})
	if err != nil {
		t.Fatal(err)
	}
	envelope := func(flags byte, msg []byte) []byte {
		out := []byte{flags, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
		return append(out, msg...)
	}
	notStale, _ := proto.Marshal(&fencev1.GetRequest{Key: "k"})
	for _, tc := range []struct {
		name, path, contentType string
		body                    []byte
		want                    bool
	}{
		{"Connect JSON", "/fence.v1.KVService/Get", "application/json", []byte(`{"key":"k","stale":true}`), true},
		{"Connect JSON, not stale", "/fence.v1.KVService/Get", "application/json", []byte(`{"key":"k"}`), false},
		{"Connect proto", "/fence.v1.KVService/Get", "application/proto", bin, true},
		{"gRPC", "/fence.v1.KVService/Get", "application/grpc", envelope(0, bin), true},
		{"gRPC, not stale", "/fence.v1.KVService/Get", "application/grpc+proto", envelope(0, notStale), false},
		{"gRPC, compressed", "/fence.v1.KVService/Get", "application/grpc", envelope(1, bin), false},
		{"ListLocks", "/fence.v1.LockService/ListLocks", "application/json", []byte(`{"stale":true}`), true},
		{"Check", "/fence.v1.LockService/Check", "application/json", []byte(`{"lock":"l","stale":true}`), true},
		{"a write", "/fence.v1.KVService/Put", "application/json", []byte(`{"key":"k","stale":true}`), false},
		{"garbage", "/fence.v1.KVService/List", "application/json", []byte(`{"stale":`), false},
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://x"+tc.path, strings.NewReader(""))
		r.Header.Set("Content-Type", tc.contentType)
		if got := staleRead(r, tc.body); got != tc.want {
			t.Errorf("%s: staleRead = %v, want %v", tc.name, got, tc.want)
		}
	}
}
