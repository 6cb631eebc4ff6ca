package apinet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// StrictJSON is Connect's JSON codec without its tolerance of unknown
// fields: a request with a misspelt field ("tll") is refused with
// InvalidArgument instead of silently taking defaults. It differs from
// protojson in two more ways, both for people typing JSON by hand:
//
//   - a duration may be written as the CLI's flags take it ("500ms", "1m",
//     "1h30m"), as well as protojson's "0.5s";
//   - answers whose false or zero fields are the answer (explicitAnswers)
//     carry every field: Check says "current": false, not nothing.
//
// The protobuf binary codecs (gRPC, Connect) are not touched.
type StrictJSON struct{}

// explicitAnswers are the messages that StrictJSON writes with every field,
// unset ones included.
var explicitAnswers = map[protoreflect.FullName]bool{
	(&fencev1.CheckResponse{}).ProtoReflect().Descriptor().FullName():        true,
	(&fencev1.ReleaseLeaseResponse{}).ProtoReflect().Descriptor().FullName(): true,
}

// Name is the codec's name, "json", which it serves in place of Connect's.
func (StrictJSON) Name() string { return "json" }

// Marshal writes v, a protobuf message, as protojson with the answers' fields.
func (StrictJSON) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot encode %T as JSON", v)
	}
	explicit := explicitAnswers[m.ProtoReflect().Descriptor().FullName()]
	return protojson.MarshalOptions{EmitUnpopulated: explicit}.Marshal(m)
}

// Unmarshal reads data into v, refusing unknown fields.
func (StrictJSON) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("cannot decode JSON into %T", v)
	}
	md := m.ProtoReflect().Descriptor()
	name := md.FullName()
	if len(data) == 0 {
		return fmt.Errorf("the body is empty; send a JSON %s (at least {})", name)
	}
	data, err := goDurations(data, md)
	if err != nil {
		return fmt.Errorf("the body is not a valid JSON %s: %w", name, err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("the body is not a valid JSON %s: %w", name, err)
	}
	return nil
}

var durationName = (&durationpb.Duration{}).ProtoReflect().Descriptor().FullName()

// goDurations rewrites the durations of a JSON md written as Go writes them
// ("500ms", "1m30s") in protojson's form ("0.500s"), in md's fields and
// those of the messages it holds, and leaves everything else to protojson.
// It returns data itself when nothing needs rewriting, and an error naming
// the field and the accepted forms for a duration that is neither form.
func goDurations(data []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	if !bytes.Contains(data, []byte(`"`)) {
		return data, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return data, nil // not an object: protojson says what is wrong
	}
	changed := false
	for key, raw := range obj {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		if fd == nil || fd.Message() == nil || fd.IsMap() {
			continue
		}
		var out json.RawMessage
		var err error
		switch {
		case fd.IsList():
			out, err = eachElement(raw, func(elem json.RawMessage) (json.RawMessage, error) { return goDuration(elem, fd) })
		default:
			out, err = goDuration(raw, fd)
		}
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(out, raw) {
			obj[key], changed = out, true
		}
	}
	if !changed {
		return data, nil
	}
	return json.Marshal(obj)
}

// goDuration rewrites raw, the value of the message field fd: a duration
// in protojson's form, or the message's own durations.
func goDuration(raw json.RawMessage, fd protoreflect.FieldDescriptor) (json.RawMessage, error) {
	if fd.Message().FullName() != durationName {
		return goDurations(raw, fd.Message())
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return raw, nil // not a string: protojson says what is wrong
	}
	if protojson.Unmarshal(raw, &durationpb.Duration{}) == nil {
		return raw, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("field %s: %q is not a duration; send a string such as \"1.5s\", \"500ms\" or \"1m30s\"", fd.JSONName(), s)
	}
	return protojson.Marshal(durationpb.New(d))
}

// eachElement applies fn to every element of raw, if it is a JSON array.
func eachElement(raw json.RawMessage, fn func(json.RawMessage) (json.RawMessage, error)) (json.RawMessage, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return raw, nil
	}
	changed := false
	for i, elem := range list {
		out, err := fn(elem)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(out, elem) {
			list[i], changed = out, true
		}
	}
	if !changed {
		return raw, nil
	}
	return json.Marshal(list)
}
