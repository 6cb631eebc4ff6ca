package fence_test

import (
	"errors"
	"fmt"

	"github.com/fencelock/fence"
)

// CheckToken is the fenced write rule: a token at least the highest seen
// may write; a lower one gets a *StaleTokenError naming both.
func ExampleCheckToken() {
	fmt.Println(fence.CheckToken("orders/17", 34, 33))
	err := fence.CheckToken("orders/17", 33, 34)
	fmt.Println(err)
	fmt.Println(errors.Is(err, fence.ErrStaleToken))
	// Output:
	// <nil>
	// stale fencing token 33 < 34 for key orders/17
	// true
}
