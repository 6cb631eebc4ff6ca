package server

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// strictJSON is Connect's JSON codec without its tolerance of unknown
// fields: a request with a misspelt field ("tll") is refused with
// InvalidArgument instead of silently taking defaults.
type strictJSON struct{}

func (strictJSON) Name() string { return "json" }

func (strictJSON) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot encode %T as JSON", v)
	}
	return protojson.Marshal(m)
}

func (strictJSON) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("cannot decode JSON into %T", v)
	}
	name := m.ProtoReflect().Descriptor().FullName()
	if len(data) == 0 {
		return fmt.Errorf("the body is empty; send a JSON %s (at least {})", name)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("the body is not a valid JSON %s: %w", name, err)
	}
	return nil
}
