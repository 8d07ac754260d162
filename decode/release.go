package decode

// Release drops what out keeps of the messages decoded into it, and keeps
// its scratch memory. Names, values and row images share their message's
// memory (see Decoder.Decode), and a message shares the memory of the
// whole fetch response it came in: a Decoded kept from one batch to the
// next, or by a partition that has gone quiet, would otherwise keep
// responses alive long after their batch was applied. Call it once the
// events, and the ops planned from them, are no longer used.
func (out *Decoded) Release() {
	out.Events = dropAll(out.Events)
	st := &out.st
	st.sc.release()
	st.releaseFields()
	st.decimals = dropAll(st.decimals)
	st.avro.release()
	st.avroMemo.release()
}

// dropAll empties s and zeroes its whole capacity, so that the scratch
// memory it keeps holds no pointer into a released message.
func dropAll[T any](s []T) []T {
	clear(s[:cap(s)])
	return s[:0]
}
