package decode

// Release drops what out keeps of the messages decoded into it, and keeps
// its scratch memory. Names, values and row images share their message's
// memory (see Decoder.Decode), and a message shares the memory of the
// whole fetch response it came in: a Decoded kept from one batch to the
// next, or by a partition that has gone quiet, would otherwise keep
// responses alive long after their batch was applied. Call it once the
// events, and the ops planned from them, are no longer used.
func (out *Decoded) Release() {
	clear(out.Events[:cap(out.Events)])
	out.Events = out.Events[:0]
	st := &out.st
	st.sc.reset("", nil)
	st.sc.buf = st.sc.buf[:0]
	clear(st.top[:cap(st.top)])
	clear(st.inner[:cap(st.inner)])
	clear(st.cols[:cap(st.cols)])
	clear(st.sources[:cap(st.sources)])
	clear(st.decimals[:cap(st.decimals)])
	st.top, st.inner, st.cols = st.top[:0], st.inner[:0], st.cols[:0]
	st.sources, st.decimals = st.sources[:0], st.decimals[:0]
	st.avro.s = ""
	clear(st.avro.path[:cap(st.avro.path)])
	st.avro.path = st.avro.path[:0]
	st.avroMemo = avroRowMemo{spans: st.avroMemo.spans[:0]}
}
