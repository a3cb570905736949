package tunnel

import (
	"crypto/rand"
	"testing"
	"time"
)

// The copies of an admitted INIT are recognised for initCopiesFor, a new INIT is not
// taken for a copy, and the record stays bounded however many INITs come.
func TestInitCopiesRecognisesCopiesOfAnAdmittedInit(t *testing.T) {
	var c initCopies
	t0 := time.Unix(1000, 0)
	init1, init2 := randomNoise(t), randomNoise(t)
	if c.copyOfAdmitted(init1, t0) {
		t.Fatal("an INIT never admitted taken for a copy")
	}
	c.admit(init1, t0)
	if !c.copyOfAdmitted(append([]byte(nil), init1...), t0.Add(50*time.Millisecond)) {
		t.Error("a copy 50 ms after the admitted INIT not recognised")
	}
	if c.copyOfAdmitted(init2, t0.Add(50*time.Millisecond)) {
		t.Error("a new INIT taken for a copy of another")
	}
	if c.copyOfAdmitted(init1, t0.Add(initCopiesFor)) {
		t.Errorf("a copy %v after its INIT still recognised", initCopiesFor)
	}
	if c.copyOfAdmitted(init1[:initKeyLen-1], t0) {
		t.Error("a message too short to carry a key taken for a copy")
	}

	// 100 INITs a second (the rate limit) for a minute: the record keeps about
	// initCopiesFor of them, never more than the prune size plus that.
	for i := range 6000 {
		c.admit(randomNoise(t), t0.Add(time.Duration(i)*10*time.Millisecond))
		if len(c.seen) > initCopiesPrune+1 {
			t.Fatalf("%d INITs remembered after %d admitted", len(c.seen), i+1)
		}
	}
}

func randomNoise(t *testing.T) []byte {
	b := make([]byte, 96)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
