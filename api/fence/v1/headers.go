package fencev1

// HTTP headers of the fence API, beside the messages of fence.proto.
const (
	// FollowLeaderHeader, sent with any value, asks a follower not to
	// forward the call to the leader but to answer Unavailable with the
	// leader's address (ErrorDetail.leader_address), for clients that go
	// to the leader themselves, as the Go client does.
	FollowLeaderHeader = "Fence-Follow-Leader"
	// ForwardedByHeader marks a call a follower forwarded to the leader,
	// with the follower's node id; such a call is never forwarded again.
	ForwardedByHeader = "Fence-Forwarded-By"

	// IdempotencyKeyHeader names one write call across its retries: a
	// CreateSession, Put, Delete or Txn whose key the service applied before is
	// not applied again, and answers as the first application did. Any
	// printable text of 1 to 64 bytes, unique per call. The service
	// remembers the last 10,000 keys.
	IdempotencyKeyHeader = "Idempotency-Key"

	// ClusterIDHeader carries a group's id (StatusResponse.cluster_id). A
	// node sets it on every answer once it knows its group's id; a client
	// that sends it is refused, with REASON_WRONG_CLUSTER and no change
	// made, by a node of another group. The Go client learns the id from
	// the first node that answers (or takes it from client.WithClusterID)
	// and then talks to that group only.
	ClusterIDHeader = "Fence-Cluster-Id"
)
