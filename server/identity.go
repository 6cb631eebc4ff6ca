package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fencelock/fence/server/internal/durable"
)

// identityFile is where a data dir records whom it belongs to
// (docs/design.md, "A group knows itself").
const identityFile = "identity"

// identity is what a data dir says of itself: the incarnation drawn the
// first time a node used it, and the group it belongs to, once known. A
// node whose data dir is lost comes back with a new incarnation and no
// group, so neither it nor its peers can take it for the member it was.
type identity struct {
	path string
	// incarnation never changes once drawn.
	incarnation string

	mu        sync.Mutex // serializes writes of the file
	group     atomic.Pointer[string]
	rejoining atomic.Bool // asked its group to add it again, not a voter yet
	// heldData says the data dir has held raft data of its group (the
	// node founded it, or was added and caught up): a node that says so
	// and holds no data lost its raft files, its identity kept, and may
	// have voted and acknowledged entries (census, startBootstrap).
	heldData atomic.Bool
	// founders is, on a node that founded its group, whom it founded the
	// group with (nil elsewhere).
	founders atomic.Pointer[founding]
}

// founding is whom a group was founded with: each founder's protocol then
// (the group's first protocol, agreed even while a founder is down:
// Server.agreeProtocol) and its data dir's incarnation (so that a founder
// slower than the others can tell, while one is down, that it never held
// the group's data: census.fromFounders). Incarnations is nil in a record
// written before it was kept.
type founding struct {
	Protocols    map[string]uint32 `json:"protocols"`
	Incarnations map[string]string `json:"incarnations,omitempty"`
}

// identityRecord is the file's form.
type identityRecord struct {
	Incarnation string `json:"incarnation"`
	Group       string `json:"group,omitempty"`
	Rejoining   bool   `json:"rejoining,omitempty"`
	// HeldData is identity.heldData.
	HeldData bool `json:"held_data,omitempty"`
	// Founders and FounderIncarnations are identity.founders.
	Founders            map[string]uint32 `json:"founders,omitempty"`
	FounderIncarnations map[string]string `json:"founder_incarnations,omitempty"`
}

// openIdentity reads the data dir's identity, drawing and writing a new
// incarnation for a data dir that has none (a new one, or one written
// before identities existed).
func openIdentity(dataDir string) (*identity, error) {
	id := &identity{path: filepath.Join(dataDir, identityFile)}
	data, err := os.ReadFile(id.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		id.incarnation = rand.Text()
		if err := id.write(identityRecord{}); err != nil {
			return nil, fmt.Errorf("writing the data dir's identity: %w", err)
		}
		return id, nil
	case err != nil:
		return nil, fmt.Errorf("reading the data dir's identity: %w", err)
	}
	var rec identityRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.Incarnation == "" {
		return nil, fmt.Errorf("the data dir's identity %s is damaged (%q); it names the group the data belongs to. "+
			"If the rest of the data dir is intact, move the file aside: the node then learns its group from its log", id.path, data)
	}
	id.incarnation = rec.Incarnation
	id.load(rec)
	return id, nil
}

// groupID returns the group the data dir belongs to, "" while unknown.
func (id *identity) groupID() string {
	if g := id.group.Load(); g != nil {
		return *g
	}
	return ""
}

// adopt records that the data dir belongs to group, durably, before it
// returns. A data dir belongs to one group for life: adopting another
// fails with ErrWrongGroup.
func (id *identity) adopt(group string) error {
	return id.update(func(rec *identityRecord) error {
		switch {
		case rec.Group == group:
			return nil
		case rec.Group != "":
			return fmt.Errorf("%w: this node's data dir belongs to group %s, not %s", errWrongGroup, rec.Group, group)
		}
		rec.Group = group
		return nil
	})
}

// found records, durably, that this node founds group with founders.
func (id *identity) found(group string, founders founding) error {
	if err := id.adopt(group); err != nil {
		return err
	}
	return id.update(func(rec *identityRecord) error {
		rec.Founders, rec.FounderIncarnations = founders.Protocols, founders.Incarnations
		return nil
	})
}

// setHeldData records, durably, that the data dir holds raft data of its
// group (once recorded, it writes nothing).
func (id *identity) setHeldData() error {
	return id.update(func(rec *identityRecord) error {
		rec.HeldData = true
		return nil
	})
}

// founderProtocol returns the protocol member spoke when it founded the
// group with this node; 0 when it is no founder, or this node is none.
func (id *identity) founderProtocol(member string) uint32 {
	if f := id.founders.Load(); f != nil {
		return f.Protocols[member]
	}
	return 0
}

// founding returns whom this node founded its group with, nil when it
// founded none or its record predates the founders' incarnations.
func (id *identity) founding() *founding {
	if f := id.founders.Load(); f != nil && f.Incarnations != nil {
		return f
	}
	return nil
}

// setRejoining records, durably, whether the node asked its group to add
// it again and is not a voter yet.
func (id *identity) setRejoining(on bool) error {
	return id.update(func(rec *identityRecord) error {
		rec.Rejoining = on
		return nil
	})
}

// update changes the identity as change says, and writes it, durably,
// before it returns; a change that fails, or changes nothing, writes
// nothing.
func (id *identity) update(change func(*identityRecord) error) error {
	id.mu.Lock()
	defer id.mu.Unlock()
	before := id.record()
	rec := id.record()
	if err := change(&rec); err != nil {
		return err
	}
	if reflect.DeepEqual(rec, before) {
		return nil
	}
	if err := id.write(rec); err != nil {
		return fmt.Errorf("recording the data dir's identity in %s: %w", id.path, err)
	}
	id.load(rec)
	return nil
}

// load takes rec as the identity as it stands.
func (id *identity) load(rec identityRecord) {
	id.rejoining.Store(rec.Rejoining)
	id.heldData.Store(rec.HeldData)
	if rec.Group != "" {
		id.group.Store(&rec.Group)
	}
	if rec.Founders != nil {
		id.founders.Store(&founding{Protocols: rec.Founders, Incarnations: rec.FounderIncarnations})
	}
}

// record is the identity as it stands, in the file's form.
func (id *identity) record() identityRecord {
	rec := identityRecord{Group: id.groupID(), Rejoining: id.rejoining.Load(), HeldData: id.heldData.Load()}
	if f := id.founders.Load(); f != nil {
		rec.Founders, rec.FounderIncarnations = f.Protocols, f.Incarnations
	}
	return rec
}

// write writes rec, with the incarnation, as the data dir's identity.
func (id *identity) write(rec identityRecord) error {
	rec.Incarnation = id.incarnation
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return durable.WriteDurably(id.path, append(data, '\n'))
}

// errWrongGroup marks a node or data dir of another group.
var errWrongGroup = errors.New("another group")

// bootstrapGroupID is the id of a group bootstrapped from static peers:
// derived from each peer's id and incarnation, so that every peer computes
// the same one without a leader, and a peer whose data dir was replaced
// (a new incarnation) computes another, and does not take the group for
// its own. incarnations maps each peer's id to its incarnation.
func bootstrapGroupID(incarnations map[string]string) string {
	ids := make([]string, 0, len(incarnations))
	for id := range incarnations {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	h := sha256.New()
	for _, id := range ids {
		fmt.Fprintf(h, "%s\x00%s\n", id, incarnations[id])
	}
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil)[:16])
}
