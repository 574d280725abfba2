// A node's client as the mesh's own are written: nats.go's standard key-value API, the node's own
// user and inbox prefix, nothing else. It writes one of its own needs, reads it back, reads a
// registry kind, writes its presence, asks the verb, tries another node's key and presence, and
// prints what happened as JSON.
//
// Usage: nodeclient <url> <user> <password> <own key> <other node's key> <other node>
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	url, user, password, own, other, otherNode := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6]
	out := map[string]string{}
	say := func(step string, err error, value string) {
		if err != nil {
			out[step] = "error: " + err.Error()
		} else {
			out[step] = value
		}
	}
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.CustomInboxPrefix("_INBOX."+user), nats.Timeout(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.MaxWait(5 * time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	needs, err := js.KeyValue("mesh-provisioner_needs")
	say("open", err, "opened")
	if err == nil {
		_, err = needs.Put(own, []byte(`{"placeholder":"${config:go}"}`))
		say("put", err, "written")
		entry, err := needs.Get(own)
		if err == nil {
			say("get", nil, string(entry.Value()))
		} else {
			say("get", err, "")
		}
		_, err = needs.Put(other, []byte(`"by a go client"`))
		say("putOther", err, "written")
	}
	registry, err := js.KeyValue("mesh-provisioner_registry")
	if err == nil {
		entry, err := registry.Get("port")
		if err == nil {
			say("registry", nil, string(entry.Value()))
		} else {
			say("registry", err, "")
		}
	} else {
		say("registry", err, "")
	}
	presence, err := js.KeyValue("mesh-provisioner_presence")
	if err == nil {
		_, err = presence.Put(user, []byte(`{"everySeconds":15,"client":"nodeclient.go"}`))
		say("presence", err, "written")
		_, err = presence.Put(otherNode, []byte(`{"everySeconds":15}`))
		say("presenceOther", err, "written")
	} else {
		say("presence", err, "")
	}
	reply, err := nc.Request("mesh-provisioner.provisioning", []byte(`{"what":"registry","kind":"port"}`), 5*time.Second)
	if err == nil {
		say("verb", nil, string(reply.Data))
	} else {
		say("verb", err, "")
	}
	text, _ := json.Marshal(out)
	fmt.Println(string(text))
}
