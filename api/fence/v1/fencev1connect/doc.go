// Package fencev1connect holds the Connect clients and handlers of fence's
// public API, generated from api/fence/v1/fence.proto by
// `go generate ./api/...`. The client and the server use them; they stand
// on the ground floor with the messages of package fencev1.
package fencev1connect
