package fsm

import "fmt"

// enumName is the String of the state's small enumerations: v's name in
// names, or kind(v) for a value without one (such as one a newer version
// added).
func enumName[T ~uint8 | ~uint32](v T, kind string, names map[T]string) string {
	if name, ok := names[v]; ok {
		return name
	}
	return fmt.Sprintf("%s(%d)", kind, uint32(v))
}
