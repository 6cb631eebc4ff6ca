package fsm

// Seq is a command's place in the log: the index of its raft entry, and
// its place in the entry's batch (0 for an entry of one command). Seqs
// order commands as they were applied, so they order their effects where
// several commands share one entry.
type Seq uint64

// seqBatchBits is how many low bits of a Seq number a command within its
// entry; raft indexes below 2^48 fit in the rest.
const seqBatchBits = 12

// SeqOf returns the Seq of the i-th command of the entry at index.
func SeqOf(index uint64, i int) Seq { return Seq(index<<seqBatchBits | uint64(i)) }

// Index is the raft index of the entry that holds the command.
func (s Seq) Index() uint64 { return uint64(s) >> seqBatchBits }
